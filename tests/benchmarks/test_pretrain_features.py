"""benchmarks/pretrain_features.py on a hand-made work folder: one run from scratch and one pretrained run, each
with a final checkpoint whose norm weights are set by hand, so that every travel is known."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pretrain_features  # noqa: E402


def _norm(gamma: float, channels: int = 4) -> dict:
    return {"weight": torch.full((channels,), gamma), "bias": torch.zeros(channels),
            "running_mean": torch.zeros(channels), "running_var": torch.ones(channels)}


def _weights(encoder_gamma: float, decoder_gamma: float) -> dict:
    weights = {"encoder.conv1.weight": torch.ones(4, 3, 3, 3), "encoder.conv1.bias": torch.zeros(4)}
    weights.update({f"encoder.bn1.{k}": v for k, v in _norm(encoder_gamma).items()})
    # an InstanceNorm without running statistics, found by its name
    weights.update({"decoder.stage.norm.weight": torch.full((2,), decoder_gamma),
                    "decoder.stage.norm.bias": torch.zeros(2)})
    return weights


def _run(work: Path, method: str, seed: int, weights: dict, logging: dict) -> None:
    fold = work / "runs_iterations8_bs2_e2" / method / f"seed_{seed}" / "nnUNet_results" / "Dataset1_X" / "T__P__2d"
    (fold / "fold_0").mkdir(parents=True)
    torch.save({"network_weights": weights, "logging": logging}, fold / "fold_0" / "checkpoint_final.pth")


def test_travel_from_one_from_scratch_and_from_the_pretraining_file_when_pretrained(tmp_path):
    work = tmp_path / "work"
    _run(work, "meddisseg", 0, _weights(1.25, 0.5),
         {"mean_fg_dice": [0.2, 0.4], "dispersion_effective_rank": [3.0, float("nan"), 2.5],
          "dispersion_mean_pairwise_distance": [0.3, 0.1]})
    pretrained = tmp_path / "pre.pth"
    torch.save({"network_weights": {f"encoder.bn1.{k}": v for k, v in _norm(1.5).items()}}, pretrained)
    _run(work, "meddisseg_pretrained", 0, _weights(1.75, 1.5), {"mean_fg_dice": [0.3, 0.6]})
    results = tmp_path / "study.json"
    results.write_text(json.dumps({"runs": [
        {"method": "meddisseg", "seed": 0, "budget": "iterations8_bs2", "status": "done"},
        {"method": "meddisseg_pretrained", "seed": 0, "budget": "iterations8_bs2", "status": "done",
         "pretraining": {"file": str(pretrained)}},
        {"method": "meddisseg", "seed": 1, "budget": "iterations8_bs2", "status": "stopped"}]}))

    assert pretrain_features.main(["--work", str(work), "--results", str(results), "--out", str(tmp_path / "out"),
                                   "--name", "f"]) == 0
    runs = {r["method"]: r for r in json.loads((tmp_path / "out" / "f.json").read_text())["runs"]}
    assert sorted(runs) == ["meddisseg", "meddisseg_pretrained"]  # the stopped run is not read
    scratch, pre = runs["meddisseg"], runs["meddisseg_pretrained"]
    assert scratch["finetune_travel"] == pytest.approx({"encoder": 0.25, "decoder": 0.5})
    assert scratch["pretrain_travel"] is None
    # the encoder's norm travels from the pretraining's 1.5, the decoder (not pretrained) from 1
    assert pre["finetune_travel"] == pytest.approx({"encoder": 0.25, "decoder": 0.5})
    assert pre["pretrain_travel"] == pytest.approx({"encoder": 0.5})
    assert scratch["dispersion_effective_rank"] == [3.0, 2.5] and pre["dispersion_effective_rank"] is None
    assert scratch["pseudo_dice"] == [0.2, 0.4]
    markdown = (tmp_path / "out" / "f.md").read_text()
    assert "| meddisseg | 1 | 20.0 | 40.0 |" in markdown and "| meddisseg_pretrained | 1 | 30.0 | 60.0 |" in markdown
    # --methods: only those arms' runs
    assert pretrain_features.main(["--work", str(work), "--results", str(results), "--out", str(tmp_path / "out"),
                                   "--name", "g", "--methods", "meddisseg_pretrained"]) == 0
    assert [r["method"] for r in json.loads((tmp_path / "out" / "g.json").read_text())["runs"]] == \
        ["meddisseg_pretrained"]
    with pytest.raises(SystemExit, match="has no finished run of default"):
        pretrain_features.main(["--work", str(work), "--results", str(results), "--methods", "default"])


def test_a_missing_checkpoint_is_one_line(tmp_path):
    results = tmp_path / "study.json"
    results.write_text(json.dumps({"runs": [{"method": "meddisseg", "seed": 0, "budget": "b", "status": "done"}]}))
    with pytest.raises(SystemExit, match="expected one checkpoint_final.pth of meddisseg seed 0"):
        pretrain_features.main(["--work", str(tmp_path), "--results", str(results), "--out", str(tmp_path)])
