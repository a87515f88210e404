"""deploy/precision_guard.py's blocks and INT8 candidates on a tiny network exported as the export exports: every
operation in one block, and an INT8 candidate that keeps every block in fp32 computes what the fp32 graph does
(nothing quantized left behind, also between the blocks: skip concatenations, the sum of two heads); the guard's
ranking of the blocks by their own harm; and what the guard of a tiny export's fold records and says about the
cases it had (the calibration tiles it used, few validation cases)."""
import io
import json

import numpy as np
import pytest
import torch
from tiny_export import description_of, tiny_graph
from torch import nn

from nnunetv2_meddisseg.deploy import precision_guard
from nnunetv2_meddisseg.deploy.precision_guard import BETWEEN_BLOCKS, _int8_candidate, _quantize, blocks
from nnunetv2_meddisseg.deploy.runtimes import OpenVinoSession, openvino_core


class _Decoder(nn.Module):
    """(N, 8, H, W) features and (N, 1, H, W) input -> (N, 8, H, W): a skip concatenated, as nnU-Net's decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.fuse = nn.Sequential(nn.Conv2d(9, 8, 3, padding=1), nn.ReLU())
        self.refine = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())

    def forward(self, features: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.refine(self.fuse(torch.cat([features, x], 1)))


class _TwoHeads(nn.Module):
    """(N, 1, H, W) -> (N, 2, H, W): an encoder, a decoder with a skip concatenation, and the sum of two heads'
    logits (as Med-DisSeg sums its decoders')."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.decoder = _Decoder()
        self.head_a = nn.Conv2d(8, 2, 1)
        self.head_b = nn.Conv2d(8, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(x)
        return self.head_a(self.decoder(features, x)) + self.head_b(features)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    network = _TwoHeads().eval()
    buffer = io.BytesIO()
    torch.onnx.export(network, (torch.zeros(1, 1, 16, 16),), buffer, input_names=["data"], output_names=["logits"],
                      opset_version=17, dynamo=False)
    return openvino_core().read_model(buffer.getvalue())


@pytest.fixture
def groups(model, monkeypatch):
    """The blocks, a module with more than one convolution split into its children (the decoder's concatenation
    then belongs to none of them, as in nnU-Net's decoder of more than MAX_BLOCK_OPS convolutions)."""
    monkeypatch.setattr(precision_guard, "MAX_BLOCK_OPS", 1)
    return blocks(model)


def _tiles(count: int, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, (1, 1, 16, 16)).astype(np.float32) for _ in range(count)]


def test_every_operation_is_in_exactly_one_block(model, groups):
    names = [name for members in groups.values() for name in members]
    ops = [op.get_friendly_name() for op in model.get_ordered_ops()
           if op.get_type_name() not in ("Constant", "Parameter", "Result")]
    assert sorted(names) == sorted(ops)
    between = {op.get_type_name() for op in model.get_ordered_ops()
               if op.get_friendly_name() in groups[BETWEEN_BLOCKS]}
    assert {"Add", "Concat"} <= between and "/decoder/fuse" in groups and "/decoder/refine" in groups, groups


def test_an_int8_candidate_keeping_every_block_is_the_fp32_graph(model, groups):
    candidate = _int8_candidate(_quantize(model, _tiles(8, 0)), model)
    x = np.concatenate(_tiles(2, 1))
    fp32 = OpenVinoSession(model, "fp32").run(x)
    every = [name for members in groups.values() for name in members]
    assert np.abs(OpenVinoSession(candidate(every), "int8").run(x) - fp32).max() < 1e-4
    but_between = [name for key, members in groups.items() if key != BETWEEN_BLOCKS for name in members]
    assert np.abs(OpenVinoSession(candidate(but_between), "int8").run(x) - fp32).max() > 1e-3
    assert np.abs(OpenVinoSession(candidate([]), "int8").run(x) - fp32).max() > 1e-3


class _WorstBlockVerifier:
    """A stand-in for the guard's verifier whose figures follow the worst block left in reduced precision (the
    others' errors hide behind it): ``session`` is the set of operation names kept in fp32."""

    def __init__(self, harm):
        self.harm = harm

    def _worst(self, kept):
        return max([h for block, h in self.harm.items() if block not in kept] or [0.0])

    def figures(self, kept):
        return {"cases": 1, "mean_dice_to_fp32": 1 - self._worst(kept), "min_dice_to_fp32": 1 - self._worst(kept),
                "pseudo_dice_fp32": 0.8, "pseudo_dice": 0.8, "pseudo_dice_drop_points": 0.0}

    def distance(self, kept):
        return self._worst(kept)


def test_the_guard_keeps_the_blocks_whose_own_reduction_costs_most(monkeypatch):
    """Keeping one block in fp32 while the others stay reduced hides its harm behind theirs; reducing it alone
    shows it: the guard keeps exactly the two blocks that alone miss the bound."""
    monkeypatch.setattr(precision_guard, "OpenVinoSession", lambda kept, precision, threads: frozenset(kept))
    harm = {"/d": 0.0, "/c": 0.001, "/b": 0.02, "/a": 0.05}
    groups = {block: [block] for block in harm}
    record = precision_guard.guard("int8", lambda kept: kept, groups, _WorstBlockVerifier(harm),
                                   precision_guard.Bounds(), say=lambda line: None)
    assert record["verified"] and record["kept_in_fp32"] == ["/a", "/b"], record
    tried = [candidate["kept_in_fp32"] for candidate in record["tried"]]
    assert tried[0] == [] and ["/a", "/b"] in tried, tried  # the whole network first; each names its blocks


def _preprocessed(tmp_path, train: int, val: int):
    """A preprocessed folder of ``train + val`` tiny cases (3 channels, 20x18, ``.npy`` as nnU-Net unpacks them) and
    splits_final.json beside it: one fold of the first ``train`` cases for training and the rest for validation."""
    folder = tmp_path / "Dataset987_Tiny" / "nnUNetPlans_2d"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"case_{i:03d}" for i in range(train + val)]
    for name in names:
        data = rng.standard_normal((3, 1, 20, 18)).astype(np.float32)
        np.save(folder / f"{name}.npy", data)
        np.save(folder / f"{name}_seg.npy", (data[:1] > 0).astype(np.int8))
    (folder.parent / "splits_final.json").write_text(json.dumps([{"train": names[:train], "val": names[train:]}]))
    return folder


@pytest.mark.parametrize("train,val,tiles,used,fewer,warned", [
    (1, 2, 64, 1, True, True),  # fewer training cases than tiles asked, few validation cases
    (3, precision_guard.FEW_VALIDATION_CASES, 2, 2, False, False),
])
def test_the_int8_record_holds_the_calibration_tiles_used_and_few_cases_are_named(tmp_path, train, val, tiles, used,
                                                                                   fewer, warned):
    description, lines = description_of({0: tiny_graph(0)}), []
    precision_guard.guard_folds(description, {"0": tiny_graph(0)}, _preprocessed(tmp_path, train, val), ["int8"],
                                precision_guard.Bounds(), tiles, threads=1, say=lines.append)
    record = description["folds"][0]["precisions"]["int8"]
    assert record["calibration_tiles"] == used and description["precision_guard"]["calibration_tiles"] == tiles
    calibration = [line for line in lines if "INT8 calibration" in line]
    assert calibration == [f"fold 0: INT8 calibration on {used} tile(s) of training cases (NNCF)"
                           + (f", fewer than the {tiles} asked: the fold has {train} training case(s)" if fewer
                              else "")]
    warning = (f"WARNING: fold 0 has only {val} validation case(s) (fewer than {precision_guard.FEW_VALIDATION_CASES})"
               f": the guard's figures rest on few cases")
    assert (warning in lines) == warned and sum(line.startswith("WARNING") for line in lines) == warned, lines
    assert record["figures"]["cases"] == val
