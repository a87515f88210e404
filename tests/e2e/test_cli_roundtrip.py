"""End to end through nnU-Net's real command line, as the README tells users to run it.

nnUNet_extTrainer is set from ``python -m nnunetv2_meddisseg.trainer_path``; every command runs on
the CPU on the generated 64x64 Dataset501 (conftest's ``preprocessed_synthetic``).
"""
import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nnunet_cli import run_until
from PIL import Image
from scratch import scratch_folder

DATASET = "Dataset501_SyntheticPolyps"
SMOKE = "nnUNetTrainerMedDisSeg_smoke"
BIN = Path(sys.executable).parent  # the console scripts of this environment


def run_cli(args, env: dict) -> subprocess.CompletedProcess:
    """Run a console command of this environment; fail with its output's tail if it fails."""
    proc = subprocess.run([str(BIN / args[0]), *map(str, args[1:])], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, (f"{' '.join(map(str, args))} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="module")
def cli_env(preprocessed_synthetic, request, tmp_path_factory) -> dict:
    env = dict(preprocessed_synthetic)
    # exactly what the README says: export nnUNet_extTrainer=$(python -m nnunetv2_meddisseg.trainer_path)
    folder = subprocess.run([sys.executable, "-m", "nnunetv2_meddisseg.trainer_path"], env=env, check=True,
                            capture_output=True, text=True).stdout.strip()
    assert Path(folder).is_dir() and Path(folder).name == "nnunet_trainers"
    env["nnUNet_extTrainer"] = folder
    # our own results, shared with nobody, deleted after the module's last test
    env["nnUNet_results"] = str(scratch_folder(request, tmp_path_factory, "results"))
    return env


def fold_folder(env: dict, trainer: str, plans: str = "nnUNetPlans") -> Path:
    return Path(env["nnUNet_results"]) / DATASET / f"{trainer}__{plans}__2d" / "fold_0"


def predict(env: dict, work: Path, trainer: str, plans: str) -> Path:
    """nnUNetv2_predict (CPU, no test-time mirroring: the trainer's own validation already ran with it)
    on two of the test images; returns the folder of their labels (predictions in work/predictions)."""
    raw = Path(env["nnUNet_raw"]) / DATASET
    images, labels, out = work / "images", work / "labels", work / "predictions"
    images.mkdir(parents=True)
    labels.mkdir()
    for label in sorted((raw / "labelsTs").glob("*.png"))[:2]:
        shutil.copy(label, labels / label.name)
        shutil.copy(raw / "imagesTs" / f"{label.stem}_0000.png", images)
    run_cli(["nnUNetv2_predict", "-i", images, "-o", out, "-d", "501", "-c", "2d", "-f", "0", "-tr", trainer,
             "-p", plans, "-npp", "0", "-nps", "0", "-device", "cpu", "--disable_tta"], env)
    predictions = sorted(out.glob("*.png"))
    assert [p.name for p in predictions] == sorted(p.name for p in labels.glob("*.png"))
    for prediction in predictions:
        values = np.asarray(Image.open(prediction))
        assert values.shape == (64, 64) and set(np.unique(values)) <= {0, 1}
    return labels


def predict_and_evaluate(env: dict, work: Path, trainer: str, plans: str) -> dict:
    """``predict``, then nnUNetv2_evaluate_folder against the labels."""
    labels = predict(env, work, trainer, plans)
    out = work / "predictions"
    model = fold_folder(env, trainer, plans).parent
    run_cli(["nnUNetv2_evaluate_folder", labels, out, "-djfile", model / "dataset.json",
             "-pfile", model / "plans.json", "-o", out / "summary.json", "-np", "1"], env)
    summary = json.loads((out / "summary.json").read_text())
    dice = summary["foreground_mean"]["Dice"]
    assert math.isfinite(dice) and 0.0 <= dice <= 1.0
    assert len(summary["metric_per_case"]) == 2
    return summary


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def train_until_killed(env: dict, log: Path, epoch: int, *extra: str) -> None:
    """Run the smoke training (with ``extra`` options) and SIGKILL it, with its whole process group, as
    soon as it starts ``epoch`` (nnU-Net logs "Epoch N" after the checkpoint of epoch N-1 is written)."""
    run_until([str(BIN / "nnUNetv2_train"), "501", "2d", "0", "-tr", SMOKE, "-device", "cpu", *extra], env, log,
              lambda: f"Epoch {epoch}\n" in log.read_text(), timeout=600)


def test_meddisseg_killed_in_both_stages_resumes_exactly(cli_env, tmp_path):
    """With a fixed run seed and single-process data loading on the CPU, the smoke schedule killed
    (kill -9) in Stage I and again in Stage II and resumed twice with --c ends with exactly the weights
    of an uninterrupted run. Then predict and evaluate with the resumed model."""
    env = {**cli_env, "nnUNet_meddisseg_seed": "0"}
    assert env["nnUNet_n_proc_DA"] == "0"
    reference_env = {**env, "nnUNet_results": str(tmp_path / "uninterrupted")}
    run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", SMOKE, "-device", "cpu"], reference_env)
    reference = load(fold_folder(reference_env, SMOKE) / "checkpoint_final.pth")

    folder = fold_folder(env, SMOKE)
    latest = folder / "checkpoint_latest.pth"
    train_until_killed(env, tmp_path / "stage1.log", 1)  # killed in Stage II's first epoch
    stage1 = load(latest)
    assert stage1["meddisseg_stage"] == "stage1" and stage1["current_epoch"] == 1
    assert "stage1_head_weights" in stage1 and stage1["run_seed"] == 0

    train_until_killed(env, tmp_path / "stage2.log", 2, "--c")  # resumed, killed in Stage II's second epoch
    resumed_log = (tmp_path / "stage2.log").read_text()
    assert "Stage II from epoch 1" in resumed_log and "Epoch 0\n" not in resumed_log  # Stage I is not repeated
    stage2 = load(latest)
    assert stage2["meddisseg_stage"] == "stage2" and stage2["current_epoch"] == 2
    assert "stage1_head_weights" not in stage2

    resumed = run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", SMOKE, "-device", "cpu", "--c"], env)
    assert "Epoch 2" in resumed.stdout and "Epoch 1\n" not in resumed.stdout
    final = load(folder / "checkpoint_final.pth")
    assert final["meddisseg_stage"] == "stage2" and final["current_epoch"] == 3
    assert final["logging"]["stage"] == [1.0, 2.0, 2.0]  # the history came back from the checkpoints
    assert final["network_weights"].keys() == reference["network_weights"].keys()
    different = [k for k, v in final["network_weights"].items() if not torch.equal(v, reference["network_weights"][k])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"
    assert final["logging"]["loss_seg"] == reference["logging"]["loss_seg"]
    assert load(folder / "checkpoint_best.pth")["meddisseg_stage"] == "stage2"
    assert not latest.exists()
    for name in ("progress.png", "progress_terms.png", "validation/summary.json"):
        assert (folder / name).is_file(), name

    predict_and_evaluate(cli_env, tmp_path, SMOKE, "nnUNetPlans")


def test_meddisseg_plans_train_predict(cli_env, tmp_path):
    """The Med-DisSeg plan (nnUNetv2_meddisseg_plan), trained and used for prediction via -p."""
    run_cli(["nnUNetv2_meddisseg_plan", "-d", "501"], cli_env)
    plans_name = "nnUNetMedDisSegPlans"
    run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", SMOKE, "-p", plans_name, "-device", "cpu"], cli_env)
    folder = fold_folder(cli_env, SMOKE, plans_name)
    assert (folder / "checkpoint_final.pth").is_file()
    plans = json.loads((folder.parent / "plans.json").read_text())
    assert plans["configurations"]["2d"]["architecture"]["network_class_name"] == \
        "nnunetv2_meddisseg.architectures.MedDisSegNet"
    # (nnUNetv2_evaluate_folder, which does not depend on the plans, ran in the test above)
    labels = predict(cli_env, tmp_path, SMOKE, plans_name)

    # a weights-only copy for sharing predicts exactly the same labels
    shared = tmp_path / "shared_model"
    run_cli(["nnUNetv2_meddisseg_weights_only", folder.parent, shared], cli_env)
    reduced, full = load(shared / "fold_0" / "checkpoint_final.pth"), load(folder / "checkpoint_final.pth")
    assert "optimizer_state" not in reduced and "optimizer_state" in full
    shared_size = (shared / "fold_0" / "checkpoint_final.pth").stat().st_size
    assert shared_size < (folder / "checkpoint_final.pth").stat().st_size / 2
    out = tmp_path / "predictions_shared"
    run_cli(["nnUNetv2_predict_from_modelfolder", "-i", tmp_path / "images", "-o", out, "-m", shared, "-f", "0",
             "-npp", "1", "-nps", "1", "-device", "cpu", "--disable_tta"], cli_env)  # this command needs >= 1
    for label in sorted(labels.glob("*.png")):
        assert np.array_equal(np.asarray(Image.open(out / label.name)),
                              np.asarray(Image.open(tmp_path / "predictions" / label.name))), label.name
    proc = run_cli(["nnUNetv2_find_best_configuration", "501", "-c", "2d", "-tr", SMOKE, "-p", plans_name,
                    "-f", "0"], cli_env)
    assert f"-tr {SMOKE}" in proc.stdout and f"-p {plans_name}" in proc.stdout
    assert (Path(cli_env["nnUNet_results"]) / DATASET / "inference_information.json").is_file()


def test_dispersive_trainer_trains(cli_env):
    """nnU-Net's own network and training + the dispersive loss on its first encoder stage."""
    trainer = "nnUNetTrainerDispersive_smoke"
    proc = run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", trainer, "-device", "cpu"], cli_env)
    folder = fold_folder(cli_env, trainer)
    assert (folder / "checkpoint_final.pth").is_file() and (folder / "progress_terms.png").is_file()
    assert "loss terms: dispersive" in proc.stdout
    curves = load(folder / "checkpoint_final.pth")["logging"]
    assert len(curves["loss_dispersive"]) == 1 and curves["loss_dispersive"][0] < 0


def ensure_trained(env: dict, trainer: str, plans: str = "nnUNetPlans") -> Path:
    """The fold-0 model folder of ``trainer``, trained now unless an earlier test trained it."""
    if not (fold_folder(env, trainer, plans) / "checkpoint_final.pth").is_file():
        run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", trainer, "-p", plans, "-device", "cpu"], env)
    return fold_folder(env, trainer, plans).parent


def test_export_install_and_validation_again(cli_env, tmp_path):
    """The CI-sized share of nnU-Net's tools on our models (all of them, on two folds: the ``slow`` layer's
    test_nnunet_tools.py): nnUNetv2_export_model_to_zip -> nnUNetv2_install_pretrained_model_from_zip into
    a fresh nnUNet_results -> nnUNetv2_predict gives the original model's labels, and ``--val --npz``
    validates fold 0 again, writing probabilities for every validation case."""
    trainer = "nnUNetTrainerDispersive_smoke"  # nnU-Net's network: a small archive
    model = ensure_trained(cli_env, trainer)
    labels = predict(cli_env, tmp_path, trainer, "nnUNetPlans")
    archive = tmp_path / "model.zip"
    run_cli(["nnUNetv2_export_model_to_zip", "-d", "501", "-o", archive, "-c", "2d", "-tr", trainer,
             "-p", "nnUNetPlans", "-f", "0"], cli_env)
    fresh = {**cli_env, "nnUNet_results": str(tmp_path / "fresh_results")}
    Path(fresh["nnUNet_results"]).mkdir()
    run_cli(["nnUNetv2_install_pretrained_model_from_zip", archive], fresh)
    out = tmp_path / "installed_predictions"
    run_cli(["nnUNetv2_predict", "-i", tmp_path / "images", "-o", out, "-d", "501", "-c", "2d", "-f", "0",
             "-tr", trainer, "-p", "nnUNetPlans", "-npp", "0", "-nps", "0", "-device", "cpu", "--disable_tta"], fresh)
    for label in sorted(labels.glob("*.png")):
        assert np.array_equal(np.asarray(Image.open(out / label.name)),
                              np.asarray(Image.open(tmp_path / "predictions" / label.name))), label.name

    validation = model / "fold_0" / "validation"
    cases = sorted(p.stem for p in validation.glob("*.png"))
    assert cases
    shutil.rmtree(validation)
    run_cli(["nnUNetv2_train", "501", "2d", "0", "-tr", trainer, "--val", "--npz", "-device", "cpu"], cli_env)
    assert sorted(p.stem for p in validation.glob("*.png")) == cases
    assert sorted(p.stem for p in validation.glob("*.npz")) == cases
    summary = json.loads((validation / "summary.json").read_text())
    assert math.isfinite(summary["foreground_mean"]["Dice"])


def test_compare_predicts_both_models_like_nnunet_predict(cli_env, tmp_path):
    """nnUNetv2_meddisseg_compare on two trained models: it predicts the test set with each (the same
    labels as nnUNetv2_predict with its default test-time mirroring), evaluates, and writes the table,
    chart, statistics and overlays; a second run predicts only the cases whose predictions are missing."""
    baseline, model = "nnUNetTrainerDispersive_smoke", SMOKE  # nnU-Net's PlainConvUNet stands in for default
    folders = [ensure_trained(cli_env, baseline), ensure_trained(cli_env, model)]
    out = tmp_path / "comparison"
    command = ["nnUNetv2_meddisseg_compare", "-d", "501", "-f", "0", "--baseline_trainer", baseline,
               "--trainer", model, "--plans", "nnUNetPlans", "-o", out, "--device", "cpu", "--num_overlays", "2"]
    proc = run_cli(command, cli_env)
    images = Path(cli_env["nnUNet_raw"]) / DATASET / "imagesTs"
    cases = sorted(p.name[:-len("_0000.png")] for p in images.glob("*_0000.png"))
    assert len(cases) == 4
    for trainer, folder in zip((baseline, model), folders):
        assert f"{folder.name}: predicted 4 case(s)" in proc.stdout
        reference = tmp_path / f"nnunet_predict_{trainer}"
        run_cli(["nnUNetv2_predict", "-i", images, "-o", reference, "-d", "501", "-c", "2d", "-f", "0",
                 "-tr", trainer, "-p", "nnUNetPlans", "-npp", "0", "-nps", "0", "-device", "cpu"], cli_env)
        for case in cases:
            ours = np.asarray(Image.open(out / "predictions" / folder.name / f"{case}.png"))
            theirs = np.asarray(Image.open(reference / f"{case}.png"))
            assert np.array_equal(ours, theirs), \
                f"{trainer}, {case}: compare's prediction differs from nnUNetv2_predict"

    table = (out / "comparison.md").read_text()
    assert baseline in table and model in table and "Wilcoxon" in table
    assert (out / "comparison.csv").is_file() and (out / "comparison_bar_chart.png").stat().st_size > 0
    with open(out / "paired_differences.csv") as f:
        differing = sum(float(row["dice_diff"]) != 0 for row in csv.DictReader(f))
    assert len(list((out / "overlays").glob("*.png"))) == min(2, differing)  # the cases that differ most

    (out / "predictions" / folders[1].name / f"{cases[0]}.png").unlink()
    again = run_cli(command, cli_env)
    assert f"{folders[0].name}: predicted 0 case(s)" in again.stdout
    assert f"{folders[1].name}: predicted 1 case(s)" in again.stdout
