"""The accuracy guard of ``nnUNetv2_meddisseg_export --int8 / --bf16``: a fold runs in INT8 or bf16 only where its
masks stay within bounds of the fp32 graph's on the fold's validation cases.

INT8 is calibrated (NNCF) on patch-sized tiles of the fold's training cases in ``splits_final.json``. Candidates and the
fp32 graph predict the validation cases as the predictor does (Gaussian sliding window, no mirroring), on OpenVINO.
Bounds (defaults): the mean over cases of the Dice of the candidate's mask to the fp32 mask (mean over foreground
labels; 1 where both are empty) >= 0.99; the pseudo Dice to the ground truth as nnU-Net's validation computes it (TP,
FP, FN summed over the cases per label, their Dice averaged over the labels) at most 0.5 points below fp32's.

Where the whole network misses a bound, blocks stay in fp32: the operations under one module path (one level deeper
where a top-level module has more than ``MAX_BLOCK_OPS`` convolutions), plus one block of the operations between
them, so no kept block leaves a quantized input behind. Blocks are ranked by how far each alone in reduced precision
moves the probabilities from fp32's (one kept in fp32 among reduced ones would hide behind the others' errors);
bisection keeps the fewest top-ranked blocks with which both bounds hold. If only all-fp32 does, it is not verified.

In INT8 a kept block runs as in fp32 (quantizers bypassed, original weights), and the written graph is verified again.
In bf16 a kept block carries OpenVINO's ``precise`` attribute, yet the CPU plugin may store bf16 results of ops it fuses
(an instance norm with its activation), so the guard measures what runs.
"""
from __future__ import annotations

import json
import logging
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from nnunetv2_meddisseg.cli import quiet_cuda_home_warning
from nnunetv2_meddisseg.deploy.description import GRAPH_FIELDS_KEY, graph_fields, recorded_graph_fields, sha256_of
from nnunetv2_meddisseg.deploy.image_pipeline import probabilities_from_logits, segmentation_from_logits
from nnunetv2_meddisseg.deploy.runtimes import OpenVinoSession, openvino_core, openvino_has_bf16, read_openvino_model
from nnunetv2_meddisseg.deploy.sliding_window import pad_to_patch, sliding_window_logits, tile_starts
from nnunetv2_meddisseg.errors import UserError

__all__ = ["Bounds", "GuardCases", "MAX_BLOCK_OPS", "RANKING_CASES", "BETWEEN_BLOCKS", "DEFAULT_CALIBRATION_TILES",
           "FEW_VALIDATION_CASES", "CASE_ENDINGS", "case_identifiers", "read_case", "fold_split", "load_cases",
           "blocks", "Verifier", "guard", "guard_folds"]

#: a top-level module with more convolutions than this is split into its children
MAX_BLOCK_OPS = 12
#: the validation cases that rank the blocks
RANKING_CASES = 8
#: the block of the operations between the blocks with convolutions (sums and concatenations of their outputs)
BETWEEN_BLOCKS = "(between blocks)"
DEFAULT_CALIBRATION_TILES = 64
#: a fold verified on fewer validation cases than this gets a warning: its figures rest on few cases
FEW_VALIDATION_CASES = 5
_COMPUTE_OPS = ("Convolution", "GroupConvolution", "ConvolutionBackpropData", "GroupConvolutionBackpropData",
                "MatMul")


@dataclass(frozen=True)
class Bounds:
    """The least mean Dice to the fp32 masks, and the largest pseudo Dice drop in points (negative: it must gain)."""
    min_dice_to_fp32: float = 0.99
    max_pseudo_dice_drop: float = 0.5

    def missed(self, figures: dict) -> List[str]:
        """The bounds ``figures`` miss, in words; empty where both hold."""
        missed = []
        if not figures["mean_dice_to_fp32"] >= self.min_dice_to_fp32:
            missed.append(f"mean Dice to fp32 {figures['mean_dice_to_fp32']:.4f} < {self.min_dice_to_fp32:g}")
        if not figures["pseudo_dice_drop_points"] <= self.max_pseudo_dice_drop:
            missed.append(f"pseudo Dice drop {figures['pseudo_dice_drop_points']:.2f} points > "
                          f"{self.max_pseudo_dice_drop:g}")
        return missed


@dataclass
class GuardCases:
    """One fold's cases: calibration tiles (1, C, *patch) float32 from its training cases; validation cases, each
    (its name, data (C, 1, X, Y) float32, segmentation (1, X, Y) with labels >= 0)."""
    calibration: List[np.ndarray]
    validation: List[Tuple[str, np.ndarray, np.ndarray]]


#: the endings of nnU-Net's preprocessed case files, as its dataset classes write them
CASE_ENDINGS = (".b2nd", ".npy", ".npz")


def case_identifiers(folder: Path) -> List[str]:
    """The preprocessed case identifiers in ``folder`` (not the ``_seg`` files), sorted as nnU-Net sorts them."""
    return sorted({path.name[:-len(ending)] for path in Path(folder).iterdir() for ending in CASE_ENDINGS
                   if path.name.endswith(ending) and not path.name.endswith(f"_seg{ending}") and path.is_file()})


def _read_array(path: Path, read: Callable[[], np.ndarray]) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{path}: not found (a file of a preprocessed case): run nnUNetv2_preprocess for this "
                        f"configuration again")
    try:
        return np.asarray(read())
    except Exception as e:  # noqa: BLE001 (blosc2 and NumPy report a truncated or damaged file in several types)
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"{path}: cannot be read as a preprocessed case (truncated or damaged? {reason}): run "
                        f"nnUNetv2_preprocess for this configuration again") from None


def read_case(folder: Path, identifier: str, channels: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """A preprocessed case (data (C, 1, X, Y), segmentation (1, 1, X, Y)); one line naming a bad or missing file."""
    folder = Path(folder)
    if (folder / f"{identifier}.b2nd").is_file():
        import blosc2

        files = [folder / f"{identifier}{suffix}.b2nd" for suffix in ("", "_seg")]
        data, seg = (_read_array(f, lambda f=f: blosc2.open(urlpath=str(f), mode="r")[:]) for f in files)
    elif (folder / f"{identifier}.npy").is_file():
        files = [folder / f"{identifier}{suffix}.npy" for suffix in ("", "_seg")]
        data, seg = (_read_array(f, lambda f=f: np.load(f, allow_pickle=False)) for f in files)
    elif (folder / f"{identifier}.npz").is_file():
        files = [folder / f"{identifier}.npz"] * 2

        def read(key: str) -> np.ndarray:
            with np.load(files[0], allow_pickle=False) as archive:
                return archive[key]
        data, seg = (_read_array(files[0], lambda key=key: read(key)) for key in ("data", "seg"))
    else:
        raise UserError(f"{folder}: no preprocessed case {identifier} (.b2nd, .npy or .npz): run nnUNetv2_preprocess "
                        f"for this configuration")
    if not (data.ndim == 4 and data.shape[1] == 1 and np.issubdtype(data.dtype, np.number)):
        raise UserError(f"{files[0]}: holds an array of shape {data.shape}, expected a 2D preprocessed case "
                        f"(channels, 1, height, width)")
    if channels is not None and data.shape[0] != channels:
        raise UserError(f"{files[0]}: holds {data.shape[0]} channel(s), the model takes {channels}: not this "
                        f"model's preprocessed data")
    if not (seg.shape == (1, *data.shape[1:]) and np.issubdtype(seg.dtype, np.number)):
        raise UserError(f"{files[1]}: holds a segmentation of shape {seg.shape}, expected {(1, *data.shape[1:])} "
                        f"(its image's)")
    return data, seg


def _json_kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(
        type(value), "a number")


def fold_split(splits_file: Path, fold: str) -> Dict[str, List[str]]:
    """The fold's ``train`` and ``val`` case names in ``splits_final.json``; one line naming the file if it is bad."""
    try:
        splits = json.loads(splits_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{splits_file}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{splits_file}: not valid JSON (truncated? {e.msg} at line {e.lineno}), expected nnU-Net's "
                        f"list of splits") from None
    expected = "expected nnU-Net's list of splits, one object per fold with lists of case names 'train' and 'val'"
    if not isinstance(splits, list):
        raise UserError(f"{splits_file}: {expected}; got {_json_kind(splits)}")
    for i, split in enumerate(splits):
        for key in ("train", "val"):
            names = split.get(key) if isinstance(split, dict) else None
            if not (isinstance(names, list) and all(isinstance(name, str) and name for name in names)):
                got = f"{_json_kind(names)} as its {key!r}" if isinstance(split, dict) else _json_kind(split)
                raise UserError(f"{splits_file}: {expected}; fold {i} is {got}")
    if not str(fold).isdigit() or int(fold) >= len(splits):
        raise UserError(f"fold {fold}: not one of the {len(splits)} folds of {splits_file} (a reduced precision is "
                        f"verified on the fold's validation cases)")
    return splits[int(fold)]


def load_cases(preprocessed: Optional[Path], fold: str, patch_size: Sequence[int], calibration_tiles: int,
               seed: int = 0, channels: Optional[int] = None) -> GuardCases:
    """The fold's calibration tiles (one at a seeded random position in each of up to ``calibration_tiles`` evenly
    spaced training cases) and validation cases, from ``preprocessed`` with ``splits_final.json`` beside it."""
    if preprocessed is None:
        raise UserError("nnUNet_preprocessed is not set: the reduced precisions are calibrated and verified on the "
                        "fold's preprocessed cases")
    if not Path(preprocessed).is_dir():
        raise UserError(f"{preprocessed}: the preprocessed dataset is not there (the reduced precisions are "
                        f"calibrated and verified on the fold's preprocessed cases): run nnUNetv2_preprocess or set "
                        f"nnUNet_preprocessed")
    preprocessed = Path(preprocessed)
    splits_file = preprocessed.parent / "splits_final.json"
    if not splits_file.is_file():
        raise UserError(f"{splits_file}: not found (nnU-Net writes it when the fold is trained)")
    split = fold_split(splits_file, fold)
    if not split["val"]:
        raise UserError(f"fold {fold} of {splits_file} has no validation cases to verify a reduced precision on")
    train = split["train"]
    if calibration_tiles > 0 and not train:
        raise UserError(f"fold {fold} of {splits_file} has no training cases to calibrate INT8 on")
    rng = np.random.default_rng(seed)
    chosen = [train[int(i)] for i in np.linspace(0, len(train) - 1, min(calibration_tiles, len(train)))]
    calibration = []
    for identifier in chosen:
        padded, _ = pad_to_patch(read_case(preprocessed, identifier, channels)[0].astype(np.float32), patch_size)
        starts = [rng.choice(axis) for axis in tile_starts(padded.shape[2:], patch_size, 0.5)]
        window = tuple(slice(s, s + p) for s, p in zip(starts, patch_size))
        calibration.append(np.ascontiguousarray(padded[(slice(None), 0, *window)][None]))
    validation = []
    for identifier in split["val"]:
        data, seg = read_case(preprocessed, identifier, channels)
        validation.append((identifier, data.astype(np.float32), np.maximum(seg[0], 0)))
    return GuardCases(calibration, validation)


def _counts(mask: np.ndarray, reference: np.ndarray, labels: Sequence[int]) -> np.ndarray:
    """(labels, 3): true positives, false positives, false negatives of ``mask`` against ``reference`` per label."""
    return np.array([[np.sum((mask == label) & (reference == label)), np.sum((mask == label) & (reference != label)),
                      np.sum((mask != label) & (reference == label))] for label in labels], dtype=np.int64)


def _dice(counts: np.ndarray) -> np.ndarray:
    """Per label, 2 TP / (2 TP + FP + FN) of ``counts`` (labels, 3); 1 where the label is in neither."""
    tp, fp, fn = counts.T
    denominator = 2 * tp + fp + fn
    return np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 1.0)


class Verifier:
    """One fold's validation cases predicted once in fp32, against which candidates are scored."""

    def __init__(self, cases: GuardCases, reference, description: dict) -> None:
        d = description
        self.cases = cases.validation
        self.patch, self.step, self.heads = d["patch_size"], d["tile_step_size"], d["num_segmentation_heads"]
        self.regions = d["regions_class_order"]
        self.labels = list(self.regions) if self.regions is not None else list(range(1, self.heads))
        logits = [self._logits(reference, data) for _, data, _ in self.cases]
        self.reference_masks = [segmentation_from_logits(x, self.regions)[0] for x in logits]
        self.reference_probabilities = [probabilities_from_logits(x, self.regions)
                                        for x in logits[:RANKING_CASES]]
        self.fp32_pseudo_dice = self._pseudo_dice(self.reference_masks)

    def _logits(self, session, data: np.ndarray) -> np.ndarray:
        return sliding_window_logits(data, [session], self.patch, self.step, None, self.heads)

    def _pseudo_dice(self, masks: Sequence[np.ndarray]) -> float:
        counts = sum(_counts(mask, seg[0], self.labels) for mask, (_, _, seg) in zip(masks, self.cases))
        return float(np.mean(_dice(counts)))

    def figures(self, session) -> dict:
        """The candidate ``session``'s masks on every validation case against the fp32 masks and the ground truth."""
        masks = [segmentation_from_logits(self._logits(session, data), self.regions)[0] for _, data, _ in self.cases]
        to_fp32 = [float(np.mean(_dice(_counts(mask, reference, self.labels))))
                   for mask, reference in zip(masks, self.reference_masks)]
        pseudo_dice = self._pseudo_dice(masks)
        return {"cases": len(masks), "mean_dice_to_fp32": float(np.mean(to_fp32)), "min_dice_to_fp32": min(to_fp32),
                "pseudo_dice_fp32": self.fp32_pseudo_dice, "pseudo_dice": pseudo_dice,
                "pseudo_dice_drop_points": 100 * (self.fp32_pseudo_dice - pseudo_dice)}

    def distance(self, session) -> float:
        """The mean absolute difference of the candidate's class probabilities to fp32's on the ranking cases."""
        return float(np.mean([np.mean(np.abs(probabilities_from_logits(self._logits(session, data), self.regions)
                                             - reference))
                              for (_, data, _), reference in zip(self.cases, self.reference_probabilities)]))


def blocks(model) -> Dict[str, List[str]]:
    """``{block: names of its operations}`` of an OpenVINO model. An operation without a module path (one the
    converter made, e.g. an instance norm's MVN) joins its first consumer's block; operations in no block with a
    convolution form ``BETWEEN_BLOCKS``; constants, inputs and outputs belong to none."""
    ops = [op for op in model.get_ordered_ops() if op.get_type_name() not in ("Constant", "Parameter", "Result")]
    path: Dict[str, List[str]] = {}
    for op in reversed(ops):  # consumers first
        name = op.get_friendly_name()
        if name.startswith("/") and name.count("/") >= 2:
            path[name] = name.split("/")[1:-1]
            continue
        consumers = [target.get_node().get_friendly_name() for output in op.outputs()
                     for target in output.get_target_inputs()]
        found = next((path[c] for c in consumers if c in path), None)
        if found is not None:
            path[name] = found
        elif op.get_type_name() in _COMPUTE_OPS:
            path[name] = [name]
    compute = [op.get_friendly_name() for op in ops if op.get_type_name() in _COMPUTE_OPS]
    size = Counter(path[name][0] for name in compute if name in path)
    groups: Dict[str, List[str]] = {}
    for op in ops:
        parts = path.get(op.get_friendly_name())
        if parts is not None:
            depth = 2 if size[parts[0]] > MAX_BLOCK_OPS and len(parts) > 1 else 1
            groups.setdefault("/" + "/".join(parts[:depth]), []).append(op.get_friendly_name())
    found = {key: names for key, names in groups.items() if set(names).intersection(compute)}
    inside = {name for names in found.values() for name in names}
    between = [op.get_friendly_name() for op in ops if op.get_friendly_name() not in inside]
    return {**found, BETWEEN_BLOCKS: between} if between else found


Candidate = Callable[[Sequence[str]], object]


def guard(precision: str, candidate: Candidate, groups: Dict[str, List[str]], verifier: Verifier, bounds: Bounds,
          threads: Optional[int] = None, say: Callable[[str], None] = print) -> dict:
    """Guard one precision over ``groups``; ``candidate(ops kept in fp32) -> openvino.Model``. Returns ``verified``,
    ``kept_in_fp32``, the chosen ``figures`` (if not verified the whole network's, and a ``reason``), all ``tried``."""
    def check(kept: Sequence[str], what: str) -> dict:
        figures = _checked(verifier, OpenVinoSession(candidate([n for g in kept for n in groups[g]]), precision,
                                                     threads), bounds)
        tried.append({**figures, "kept_in_fp32": list(kept)})
        say(f"  {precision}, {what}: {_summary(figures)}")
        return figures

    tried: List[dict] = []
    figures = check([], "whole network")
    if not figures["missed"]:
        return {"verified": True, "kept_in_fp32": [], "figures": figures, "tried": tried}
    order = list(groups)
    distance = {g: verifier.distance(OpenVinoSession(candidate([n for h in order if h != g for n in groups[h]]),
                                                     precision, threads)) for g in order}
    order.sort(key=distance.get, reverse=True)
    say(f"  {precision}: blocks ranked by their distance to fp32 when reduced alone: {', '.join(order[:8])}"
        + (", ..." if len(order) > 8 else ""))
    low, high, best = 0, len(order), None  # the whole network misses the bounds; every block in fp32 is no INT8
    while high - low > 1:
        middle = (low + high) // 2
        figures = check(order[:middle], f"{middle} of {len(order)} blocks in fp32")
        if figures["missed"]:
            low = middle
        else:
            high, best = middle, figures
    if best is None:
        return {"verified": False, "kept_in_fp32": [], "figures": tried[0], "tried": tried,
                "reason": f"{precision} misses the bounds unless every block stays in fp32 "
                          f"({'; '.join(tried[-1]['missed'])} with {low} of {len(order)})"}
    return {"verified": True, "kept_in_fp32": order[:high], "figures": best, "tried": tried}


def _checked(verifier: Verifier, session: OpenVinoSession, bounds: Bounds) -> dict:
    figures = verifier.figures(session)
    figures["missed"] = bounds.missed(figures)
    return figures


def _summary(figures: dict) -> str:
    return (f"mean Dice to fp32 {figures['mean_dice_to_fp32']:.4f}, pseudo Dice {100 * figures['pseudo_dice']:.2f} "
            f"(fp32 {100 * figures['pseudo_dice_fp32']:.2f}) -> {'; '.join(figures['missed']) or 'within the bounds'}")


def _int8_candidate(quantized, original) -> Candidate:
    """Candidates whose kept ops run as in the fp32 ``original``: FakeQuantize inputs bypassed, original constants."""
    from openvino import op as ov_op

    constants = {node.get_friendly_name(): {i: source.get_node() for i, source in enumerate(node.input_values())
                                            if source.get_node().get_type_name() == "Constant"}
                 for node in original.get_ordered_ops()}

    def make(kept: Sequence[str]):
        model, kept = quantized.clone(), set(kept)
        for node in model.get_ordered_ops():
            if node.get_friendly_name() not in kept:
                continue
            originals = constants.get(node.get_friendly_name(), {})
            for i, port in enumerate(node.inputs()):
                source = port.get_source_output().get_node()
                if i in originals:
                    port.replace_source_output(ov_op.Constant(originals[i].get_data()).output(0))
                elif source.get_type_name() == "FakeQuantize":
                    port.replace_source_output(source.input_value(0))
        return model
    return make


def _mark_fp32(xml_text: str, kept: Sequence[str]) -> str:
    """The IR with OpenVINO's ``precise`` runtime attribute on the layers named in ``kept``."""
    root, kept = ET.fromstring(xml_text), set(kept)
    for layer in root.iter("layer"):
        if layer.get("name") in kept:
            info = layer.find("rt_info")
            if info is None:
                info = ET.SubElement(layer, "rt_info")
            ET.SubElement(info, "attribute", name="precise", version="0")
    return ET.tostring(root, encoding="unicode")


def _serialized(model, folder: Path) -> Tuple[str, bytes]:
    """An OpenVINO model as its IR: (the XML, the weights' bytes)."""
    import openvino as ov

    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    return (folder / "model.xml").read_text(), (folder / "model.bin").read_bytes()


def _quantize(model, tiles: List[np.ndarray]):
    quiet_cuda_home_warning()  # NNCF imports PyTorch's extension builder, which warns on a CPU with a CUDA toolkit
    try:
        import nncf
    except ImportError as e:
        raise UserError("--int8: nncf is not installed: pip install 'nnunetv2_meddisseg[openvino]'") from e
    nncf.set_log_level(logging.WARNING)
    return nncf.quantize(model.clone(), nncf.Dataset(tiles), subset_size=len(tiles),
                         target_device=nncf.TargetDevice.CPU)


def guard_folds(description: dict, graphs: Dict[str, bytes], preprocessed: Optional[Path], precisions: Sequence[str],
                bounds: Bounds, calibration_tiles: int = DEFAULT_CALIBRATION_TILES,
                threads: Optional[int] = None, say: Callable[[str], None] = print) -> Dict[str, bytes]:
    """Guard ``precisions`` for every fold (``graphs[fold]``: its fp32 ONNX graph), recording each fold's
    ``precisions``; returns the files to write (``{path: bytes}``). A precision not verified ends in one line."""
    bf16 = "bf16" in precisions
    if bf16 and not openvino_has_bf16():
        raise UserError("--bf16: this CPU has no native bf16, so bf16 cannot be verified here: nothing written")
    core = openvino_core()
    files: Dict[str, bytes] = {}
    description["precision_guard"] = {"bounds": asdict(bounds), "calibration_tiles": calibration_tiles,
                                      "validation": "the fold's validation cases (splits_final.json), preprocessed, "
                                                    "sliding window without mirroring, against the fp32 graph"}
    # all folds' cases are read first: a bad case or split stops the export before minutes of guarding
    fold_cases = [load_cases(preprocessed, fold["fold"], description["patch_size"],
                             calibration_tiles if "int8" in precisions else 0,
                             channels=description["num_input_channels"]) for fold in description["folds"]]
    for fold, cases in zip(description["folds"], fold_cases):
        name = fold["fold"]
        with tempfile.TemporaryDirectory() as scratch:
            scratch = Path(scratch)
            (scratch / "model.onnx").write_bytes(graphs[name])
            model = core.read_model(str(scratch / "model.onnx"))
            say(f"fold {name}: verifying on {len(cases.validation)} validation case(s)")
            if len(cases.validation) < FEW_VALIDATION_CASES:
                say(f"WARNING: fold {name} has only {len(cases.validation)} validation case(s) (fewer than "
                    f"{FEW_VALIDATION_CASES}): the guard's figures rest on few cases")
            verifier = Verifier(cases, OpenVinoSession(model, "fp32", threads), description)
            groups = blocks(model)
            records = {}
            if bf16:
                xml, weights = _serialized(model, scratch)
                record = guard("bf16", lambda kept: read_openvino_model(_mark_fp32(xml, kept).encode(), weights),
                               groups, verifier, bounds, threads, say)
                if record["verified"] and record["kept_in_fp32"]:
                    kept = [n for g in record["kept_in_fp32"] for n in groups[g]]
                    record.update(_written(fold, "bf16", _mark_fp32(xml, kept).encode(), weights, files))
                elif record["verified"]:
                    record.update(model=fold["file"], files={})
                records["bf16"] = record
            if "int8" in precisions:
                tiles = len(cases.calibration)
                say(f"fold {name}: INT8 calibration on {tiles} tile(s) of training cases (NNCF)"
                    + (f", fewer than the {calibration_tiles} asked: the fold has {tiles} training case(s)"
                       if tiles < calibration_tiles else ""))
                candidate = _int8_candidate(_quantize(model, cases.calibration), model)
                record = guard("int8", candidate, groups, verifier, bounds, threads, say)
                if record["verified"]:
                    chosen = candidate([n for g in record["kept_in_fp32"] for n in groups[g]])
                    record = _written_int8(fold, chosen, record, verifier, bounds, scratch, files, threads, say)
                records["int8"] = {**record, "calibration_tiles": tiles}
        for precision in precisions:
            if not records[precision]["verified"]:
                raise UserError(f"fold {name}: {records[precision]['reason']}; bounds: mean Dice to fp32 >= "
                                f"{bounds.min_dice_to_fp32:g}, pseudo Dice drop <= {bounds.max_pseudo_dice_drop:g} "
                                f"points: nothing written")
        fold["precisions"] = records
    for name, content in files.items():  # OpenVINO keeps the ONNX graph's metadata in the IRs it writes
        if name.endswith(".xml") and recorded_graph_fields(content, name) != [graph_fields(description)]:
            raise UserError(f"{name}: OpenVINO did not keep the fp32 graph's {GRAPH_FIELDS_KEY} in the IR, against "
                            f"which the predictor checks the description: nothing written")
    return files


def _written_int8(fold: dict, model, record: dict, verifier: Verifier, bounds: Bounds, scratch: Path,
                  files: Dict[str, bytes], threads: Optional[int], say: Callable[[str], None]) -> dict:
    """The chosen INT8 candidate ``model`` written as an IR (int8 weights), read back and verified again: the figures
    are the written graph's. With native bf16, verified once more with its floats in bf16 (``floats_in_bf16``)."""
    folder = scratch / "int8"
    folder.mkdir()
    xml, weights = _serialized(model, folder)
    figures = _checked(verifier, OpenVinoSession(folder / "model.xml", "int8", threads), bounds)
    if figures["missed"]:
        return {**record, "verified": False, "figures": figures,
                "reason": f"the written INT8 graph misses the bounds ({'; '.join(figures['missed'])})"}
    if not openvino_has_bf16():
        floats = {"verified": False, "reason": "the CPU of the export has no native bf16"}
    else:
        bf16 = _checked(verifier, OpenVinoSession(folder / "model.xml", "int8", threads, floats="bf16"), bounds)
        say(f"  int8, float operations in bf16: {_summary(bf16)}")
        floats = {"verified": not bf16["missed"], "figures": bf16}
        if bf16["missed"]:
            floats["reason"] = f"misses the bounds ({'; '.join(bf16['missed'])})"
    return {**record, "figures": figures, "floats_in_bf16": floats,
            **_written(fold, "int8", xml.encode(), weights, files)}


def _written(fold: dict, precision: str, xml: bytes, weights: bytes, files: Dict[str, bytes]) -> dict:
    """Adds a fold's IR in ``precision`` to ``files``; its record's ``model`` and ``files`` (with their sha256)."""
    stem = f"{Path(fold['file']).parent.as_posix()}/model_{precision}"
    entries = {f"{stem}.xml": xml, f"{stem}.bin": weights}
    files.update(entries)
    return {"model": f"{stem}.xml", "files": {name: sha256_of(content) for name, content in entries.items()}}
