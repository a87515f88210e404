"""ONNX deployment end to end (docs/deploy.md): smoke models of Med-DisSeg, the Dispersive trainer and default
nnU-Net trained through nnU-Net's command line on a generated 32x32 dataset, exported with
``nnUNetv2_meddisseg_export`` and predicted with ``nnUNetv2_meddisseg_predict_onnx``; the masks must match
``nnUNetv2_predict``'s on the same cases (Dice >= 0.999 per case), with and without mirroring, for one and two
folds. The cases are larger than the 32x32 patch (several tiles), smaller (padding) and framed in black
(nnU-Net's crop to the non-zero region)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import pytest
from nnunet_cli import nnunet_env, planning_environment, run_cli
from PIL import Image
from scratch import scratch_folder

from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset, synthetic_case
from nnunetv2_meddisseg.deploy import export
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE

DATASET = "503"
TRAINERS = {"meddisseg": "nnUNetTrainerMedDisSeg_smoke", "dispersive": "nnUNetTrainerDispersive_smoke",
            "nnunet": "nnUNetTrainerBaseline_smoke"}
FOLDS = {"meddisseg": ("0", "1"), "dispersive": ("0",), "nnunet": ("0",)}
#: (height, width) of the predicted cases; the last is framed in black
CASE_SIZES = [(32, 32), (48, 40), (20, 24), (64, 56)]
CPU = ("-device", "cpu")


def _write_cases(folder: Path) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    for i, (h, w) in enumerate(CASE_SIZES):
        image = synthetic_case(rng, 64)[0][:h, :w].copy()
        if i == len(CASE_SIZES) - 1:
            image[:5], image[:, -6:] = 0, 0
        Image.fromarray(image).save(folder / f"case{i}_0000.png")


@pytest.fixture(scope="module")
def deployed(request, tmp_path_factory) -> dict:
    """The trained smoke models (MedDisSeg on folds 0 and 1, the others on fold 0), each exported to
    ``<root>/onnx/<key>``; returns the environment, the export folders and the cases folder."""
    root = scratch_folder(request, tmp_path_factory, "onnx_deploy")
    env = {**nnunet_env(root / "nnunet"), "OMP_NUM_THREADS": "1", "nnUNet_def_n_proc": "1"}
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=int(DATASET), num_train=8, num_test=0, size=32, seed=0)
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", DATASET, "-c", "2d", "-np", "1"], planning_environment(env))
    exports = {}
    for key, trainer in TRAINERS.items():
        for fold in FOLDS[key]:
            run_cli(["nnUNetv2_train", DATASET, "2d", fold, "-tr", trainer, *CPU], env)
        exports[key] = root / "onnx" / key
        run_cli(["nnUNetv2_meddisseg_export", "-d", DATASET, "-tr", trainer, "-f", *FOLDS[key],
                 "-o", exports[key]], env)
    _write_cases(root / "cases")
    return {"env": env, "exports": exports, "cases": root / "cases", "root": root}


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    both = (a > 0).sum() + (b > 0).sum()
    return 1.0 if both == 0 else 2.0 * ((a > 0) & (b > 0)).sum() / both


def _predict_both(deployed: dict, key: str, folds: Tuple[str, ...], tta: bool, name: str) -> Dict[str, Path]:
    out = {which: deployed["root"] / name / which for which in ("nnunet", "onnx")}
    flag = [] if tta else ["--disable_tta"]
    run_cli(["nnUNetv2_predict", "-i", deployed["cases"], "-o", out["nnunet"], "-d", DATASET, "-c", "2d",
             "-tr", TRAINERS[key], "-f", *folds, *CPU, "-npp", "0", "-nps", "0", "--save_probabilities", *flag],
            deployed["env"])
    run_cli(["nnUNetv2_meddisseg_predict_onnx", "-i", deployed["cases"], "-o", out["onnx"], "-m",
             deployed["exports"][key], "-f", *folds, "--threads", "1", "--save_probabilities", *flag], deployed["env"])
    return out


@pytest.mark.parametrize("key,folds,tta", [
    ("meddisseg", ("0",), True), ("meddisseg", ("0",), False), ("meddisseg", ("0", "1"), True),
    ("meddisseg", ("0", "1"), False), ("dispersive", ("0",), True), ("nnunet", ("0",), True),
    ("nnunet", ("0",), False)])
def test_onnx_predictor_matches_nnunet_predict(deployed, key, folds, tta):
    name = f"{key}_{'_'.join(folds)}_{'tta' if tta else 'notta'}"
    out = _predict_both(deployed, key, folds, tta, name)
    largest = 0.0
    for i, (h, w) in enumerate(CASE_SIZES):
        ours = np.asarray(Image.open(out["onnx"] / f"case{i}.png"))
        theirs = np.asarray(Image.open(out["nnunet"] / f"case{i}.png"))
        assert ours.shape == theirs.shape == (h, w) and ours.dtype == theirs.dtype
        assert _dice(ours, theirs) >= 0.999, (name, i, _dice(ours, theirs))
        p_ours = np.load(out["onnx"] / f"case{i}.npz")["probabilities"]
        p_theirs = np.load(out["nnunet"] / f"case{i}.npz")["probabilities"]
        assert p_ours.shape == p_theirs.shape == (2, 1, h, w)
        difference = np.abs(p_ours - p_theirs)
        where = np.unravel_index(difference.argmax(), difference.shape)
        print(f"{name} case{i}: largest probability difference {difference.max():.2e} at {where[2:]} "
              f"({p_ours[where]:.4f} vs {p_theirs[where]:.4f})")
        largest = max(largest, float(difference.max()))
    # both sum the logits in float16, whose steps grow with the logits (1/16 from 64 up): where two classes'
    # large logits nearly tie, one step moves a probability by up to ~0.016; the masks (above) must agree
    assert largest < 0.05, largest


def test_description_holds_the_plans(deployed):
    description = json.loads((deployed["exports"]["meddisseg"] / DESCRIPTION_FILE).read_text())
    plans = json.loads((Path(deployed["env"]["nnUNet_preprocessed"]) / "Dataset503_SyntheticPolyps"
                        / "nnUNetPlans.json").read_text())
    assert description["patch_size"] == plans["configurations"]["2d"]["patch_size"] == [32, 32]
    assert [n["scheme"] for n in description["normalization"]] == plans["configurations"]["2d"]["normalization_schemes"]
    assert description["trainer"] == TRAINERS["meddisseg"] and [f["fold"] for f in description["folds"]] == ["0", "1"]
    for fold in description["folds"]:
        assert {c["input"] for c in fold["checks"]} >= {"random patches", "case synth_tr_000"}
        assert all(c["relative_difference"] <= export.DEFAULT_TOLERANCE for c in fold["checks"])


def test_export_refuses_a_wrong_graph_and_writes_nothing(deployed, monkeypatch, capsys, tmp_path):
    # the shifted CDFA form: the tracer drops its in-place writes and exports a graph that runs but is wrong
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results", "nnUNet_extTrainer"):
        monkeypatch.setenv(name, deployed["env"][name])
    monkeypatch.setattr(export, "EXPORT_FORM", "shifted")
    target = tmp_path / "wrong"
    code = export.main(["-d", DATASET, "-tr", TRAINERS["meddisseg"], "-f", "0", "-o", str(target)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("nnUNetv2_meddisseg_export: error: fold 0: ONNX Runtime's logits "
                                                   "differ from PyTorch's"), err
    assert "nothing written" in err
    assert list(tmp_path.iterdir()) == []
