"""ONNX deployment end to end (docs/deploy.md): smoke models of Med-DisSeg, the Dispersive trainer and default
nnU-Net trained through nnU-Net's command line on a generated 32x32 dataset, exported with
``nnUNetv2_meddisseg_export`` and predicted with ``nnUNetv2_meddisseg_predict_onnx`` on ONNX Runtime and OpenVINO;
the masks must match ``nnUNetv2_predict``'s on the same cases (Dice >= 0.999 per case), with and without mirroring,
for one and two folds. The cases are larger than the 32x32 patch (several tiles), smaller (padding) and framed in
black (nnU-Net's crop to the non-zero region). The reduced precisions: an INT8 export whose predictor's masks agree
with the figures its guard recorded, the guard refusing a bound no model can meet (nothing written), bf16 refused
on a CPU without it (simulated), and ``benchmarks/onnx_predict.py`` on the trained models."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import pytest
from nnunet_cli import nnunet_env, planning_environment, run_cli
from PIL import Image
from scratch import scratch_folder

from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset, synthetic_case
from nnunetv2_meddisseg.deploy import export, runtimes
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, sha256_of

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DATASET = "503"
TRAINERS = {"meddisseg": "nnUNetTrainerMedDisSeg_smoke", "dispersive": "nnUNetTrainerDispersive_smoke",
            "nnunet": "nnUNetTrainerBaseline_smoke"}
FOLDS = {"meddisseg": ("0", "1"), "dispersive": ("0",), "nnunet": ("0",)}
#: (height, width) of the predicted cases; the last is framed in black
CASE_SIZES = [(32, 32), (48, 40), (20, 24), (64, 56)]
CPU = ("-device", "cpu")
RUNTIMES = ("onnxruntime", "openvino")


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


def _predict_all(deployed: dict, key: str, folds: Tuple[str, ...], tta: bool, name: str) -> Dict[str, Path]:
    """nnUNetv2_predict's masks and probabilities, and ours on each runtime."""
    out = {which: deployed["root"] / name / which for which in ("nnunet",) + RUNTIMES}
    flag = [] if tta else ["--disable_tta"]
    run_cli(["nnUNetv2_predict", "-i", deployed["cases"], "-o", out["nnunet"], "-d", DATASET, "-c", "2d",
             "-tr", TRAINERS[key], "-f", *folds, *CPU, "-npp", "0", "-nps", "0", "--save_probabilities", *flag],
            deployed["env"])
    for runtime in RUNTIMES:
        run_cli(["nnUNetv2_meddisseg_predict_onnx", "-i", deployed["cases"], "-o", out[runtime], "-m",
                 deployed["exports"][key], "-f", *folds, "--threads", "1", "--save_probabilities", "--runtime",
                 runtime, *flag], deployed["env"])
    return out


#: the largest probability difference to nnU-Net's predictor: a mask pixel may differ only where nnU-Net's foreground
#: probability is this close to 0.5
TIE = 0.05


@pytest.mark.parametrize("key,folds,tta", [
    ("meddisseg", ("0",), True), ("meddisseg", ("0", "1"), True), ("meddisseg", ("0", "1"), False),
    ("dispersive", ("0",), True), ("nnunet", ("0",), True), ("nnunet", ("0",), False)])
def test_onnx_predictor_matches_nnunet_predict(deployed, key, folds, tta):
    name = f"{key}_{'_'.join(folds)}_{'tta' if tta else 'notta'}"
    out = _predict_all(deployed, key, folds, tta, name)
    for runtime in RUNTIMES:
        largest = 0.0
        for i, (h, w) in enumerate(CASE_SIZES):
            ours = np.asarray(Image.open(out[runtime] / f"case{i}.png"))
            theirs = np.asarray(Image.open(out["nnunet"] / f"case{i}.png"))
            assert ours.shape == theirs.shape == (h, w) and ours.dtype == theirs.dtype
            p_ours = np.load(out[runtime] / f"case{i}.npz")["probabilities"]
            p_theirs = np.load(out["nnunet"] / f"case{i}.npz")["probabilities"]
            assert p_ours.shape == p_theirs.shape == (2, 1, h, w)
            # the masks are equal but where nnU-Net's own probabilities nearly tie (the smoke models are briefly
            # trained: one pixel of these small masks moves the Dice by up to 0.003); trained models' masks equal
            # nnU-Net's in benchmarks/results/cpu_predict.json
            flipped = ours != theirs
            near_tie = np.abs(p_theirs[1, 0] - 0.5) < TIE
            assert not np.any(flipped & ~near_tie), (name, runtime, i, np.argwhere(flipped & ~near_tie)[:5])
            assert flipped.sum() <= 2, (name, runtime, i, int(flipped.sum()))
            difference = np.abs(p_ours - p_theirs)
            where = np.unravel_index(difference.argmax(), difference.shape)
            print(f"{name} {runtime} case{i}: largest probability difference {difference.max():.2e} at {where[2:]} "
                  f"({p_ours[where]:.4f} vs {p_theirs[where]:.4f})")
            largest = max(largest, float(difference.max()))
        # both sum the logits in float16, whose steps grow with the logits (1/16 from 64 up): where two classes'
        # large logits nearly tie, one step moves a probability by up to ~0.016
        assert largest < TIE, (runtime, largest)


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


#: bounds the 32x32 smoke model's INT8 graph meets as a whole (its two validation cases have ~100 foreground pixels:
#: one pixel moves the Dice by ~0.01)
LENIENT = ["--min_dice_to_fp32", "0.9", "--max_pseudo_dice_drop", "5"]
#: bounds any smoke model meets: the benchmark test times the arms, the guard is tested above
ANY = ["--min_dice_to_fp32", "0.5", "--max_pseudo_dice_drop", "50"]


def _foreground_counts(mask: np.ndarray, reference: np.ndarray) -> np.ndarray:
    a, b = mask > 0, reference > 0
    return np.array([np.sum(a & b), np.sum(a & ~b), np.sum(~a & b)])


def _dice_of(counts: np.ndarray) -> float:
    tp, fp, fn = counts
    return 1.0 if 2 * tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def test_reduced_precision_predictors_agree_with_the_recorded_verification(deployed, tmp_path):
    """The INT8 export's record, and the predictor's masks of the fold's validation cases (raw images, no mirroring)
    in int8 (and bf16, exported with --bf16 where the CPU has it) against its fp32 masks and the labels: the
    figures the guard recorded."""
    env, export_dir = deployed["env"], deployed["root"] / "int8" / "nnunet"
    run_cli(["nnUNetv2_meddisseg_export", "-d", DATASET, "-tr", TRAINERS["nnunet"], "-f", "0", "-o", export_dir,
             "--int8", *(["--bf16"] if runtimes.openvino_has_bf16() else []), *LENIENT], env)
    fold = json.loads((export_dir / DESCRIPTION_FILE).read_text())["folds"][0]
    record = fold["precisions"]["int8"]
    assert record["verified"] and record["model"] == "fold_0/model_int8.xml", record
    assert set(record["files"]) == {"fold_0/model_int8.xml", "fold_0/model_int8.bin"}
    assert all(sha256_of((export_dir / name).read_bytes()) == digest for name, digest in record["files"].items())
    raw = Path(env["nnUNet_raw"]) / "Dataset503_SyntheticPolyps"
    splits = json.loads((Path(env["nnUNet_preprocessed"]) / raw.name / "splits_final.json").read_text())
    (tmp_path / "val").mkdir()
    for case in splits[0]["val"]:
        shutil.copy(raw / "imagesTr" / f"{case}_0000.png", tmp_path / "val")
    verified = [p for p in ("int8", "bf16") if fold["precisions"].get(p, {}).get("verified")]
    for precision in ["fp32"] + verified:
        run_cli(["nnUNetv2_meddisseg_predict_onnx", "-i", tmp_path / "val", "-o", tmp_path / precision, "-m",
                 export_dir, "--disable_tta", "--runtime", "openvino", "--precision", precision], env)
    # int8's float operations run in bf16 where the export verified that too and this CPU has native bf16
    floats = record["floats_in_bf16"]
    if runtimes.openvino_has_bf16():
        assert set(floats["figures"]) >= {"mean_dice_to_fp32", "pseudo_dice"}, floats
        assert not floats["verified"] or not floats["figures"]["missed"]
    else:
        assert floats == {"verified": False, "reason": "the CPU of the export has no native bf16"}
    for precision in verified:
        figures = fold["precisions"][precision]["figures"]
        if precision == "int8" and floats["verified"] and runtimes.openvino_has_bf16():
            figures = floats["figures"]
        masks = {w: [np.asarray(Image.open(tmp_path / w / f"{case}.png")) for case in splits[0]["val"]]
                 for w in ("fp32", precision)}
        labels = [np.asarray(Image.open(raw / "labelsTr" / f"{case}.png")) for case in splits[0]["val"]]
        to_fp32 = np.mean([_dice_of(_foreground_counts(m, r)) for m, r in zip(masks[precision], masks["fp32"])])
        pseudo = {w: _dice_of(sum(_foreground_counts(m, gt) for m, gt in zip(masks[w], labels))) for w in masks}
        print(f"{precision}: mean Dice to fp32 {to_fp32:.4f} (recorded {figures['mean_dice_to_fp32']:.4f}), pseudo "
              f"Dice {pseudo[precision]:.4f} (recorded {figures['pseudo_dice']:.4f}), fp32 {pseudo['fp32']:.4f} "
              f"(recorded {figures['pseudo_dice_fp32']:.4f})")
        assert abs(to_fp32 - figures["mean_dice_to_fp32"]) <= 0.01
        assert abs(pseudo[precision] - figures["pseudo_dice"]) <= 0.005
        assert abs(pseudo["fp32"] - figures["pseudo_dice_fp32"]) <= 0.005
    assert "int8" in verified


@pytest.mark.parametrize("flags,message", [
    (["--int8", "--max_pseudo_dice_drop", "-100"], "fold 0: int8 misses the bounds unless every block stays in fp32"),
    (["--bf16"], "--bf16: this CPU has no native bf16, so bf16 cannot be verified here: nothing written"),
], ids=["int8_bound_no_model_meets", "bf16_without_cpu_support"])
def test_reduced_precision_export_refuses_and_writes_nothing(deployed, monkeypatch, capsys, tmp_path, flags, message):
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results", "nnUNet_extTrainer"):
        monkeypatch.setenv(name, deployed["env"][name])
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: ["FP32", "INT8"])  # a CPU without native bf16
    code = export.main(["-d", DATASET, "-tr", TRAINERS["nnunet"], "-f", "0", "-o", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err and err.rstrip().endswith("nothing written"), err
    assert list(tmp_path.iterdir()) == []


def test_the_cpu_benchmark_on_the_trained_models(deployed, tmp_path):
    """``benchmarks/onnx_predict.py --model`` on nnU-Net's smoke model (2 labelled test images; Med-DisSeg runs the
    same code): nnU-Net's predictor and every arm timed, each arm with the fields cpu_predict.json promises; the
    fp32 arms' masks equal nnU-Net's."""
    raw = tmp_path / "raw" / "Dataset503_SyntheticPolyps"
    rng = np.random.default_rng(11)
    for folder in ("imagesTs", "labelsTs"):
        (raw / folder).mkdir(parents=True)
    for i in range(2):
        image, label = synthetic_case(rng, 40)
        Image.fromarray(image).save(raw / "imagesTs" / f"test{i}_0000.png")
        Image.fromarray(label).save(raw / "labelsTs" / f"test{i}.png")
    results = Path(deployed["env"]["nnUNet_results"]) / raw.name
    command = [sys.executable, str(BENCHMARKS / "onnx_predict.py"), "--model",
               f"nnUNet={results / (TRAINERS['nnunet'] + '__nnUNetPlans__2d')}", "--openvino", "fp32", "bf16", "int8",
               "--export-args", " ".join(ANY), "--tta", "on", "--repeats", "1", "--threads", "1",
               "--no-forms", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    proc = subprocess.run(command, env={**deployed["env"], "nnUNet_raw": str(tmp_path / "raw")}, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: a speed target missed
    assert (proc.returncode == 1) == ("TARGET MISSED" in proc.stderr)
    payload = json.loads((tmp_path / "out" / "cpu_predict.json").read_text())
    arms = {(a["network"], a["runtime"], a["precision"]): a for a in payload["arms"]}
    bf16 = ["bf16"] if runtimes.openvino_has_bf16() else []
    expected = [("pytorch", "fp32"), ("onnxruntime CPU", "fp32"), ("openvino", "fp32"), ("openvino", "int8")]
    for runtime, precision in expected + [("openvino", p) for p in bf16]:
        arm = arms["nnUNet", runtime, precision]
        assert arm["tta"] and arm["images_per_s"] > 0 and 0 <= arm["test_mdsc"] <= 1, arm
        assert arm["speedup_vs_nnunet_predictor"] == pytest.approx(
            arm["images_per_s"] / arms["nnUNet", "pytorch", "fp32"]["images_per_s"], rel=1e-2)
        if precision == "fp32":
            assert arm["dice_to_fp32"] >= 0.999 and abs(arm["mdsc_drop_points"]) < 0.1, arm
    assert payload["targets"]["nnUNet"]["target_speedup"] == 4.0
    assert "| nnUNet | on | openvino | int8 |" in (tmp_path / "out" / "cpu_predict.md").read_text()
