"""nnUNetv2_meddisseg_ablate and nnUNetv2_meddisseg_features through the real commands on the generated
64x64 Dataset501 (conftest's ``preprocessed_synthetic``), on the CPU, at the smallest useful budget:
the full method and ``_noDispersive``, one seed (several seeds' tables: tests/ablation/test_table.py), 4 epochs
(1 of Stage I) of 1 iteration each. The ablation is killed (kill -9) in its second run after that run's Stage I
checkpoint and rerun."""
import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from nnunet_cli import run_until
from scratch import scratch_folder

from nnunetv2_meddisseg.ablation.runs import budget_plans_name

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
DATASET = "Dataset501_SyntheticPolyps"
FULL, VARIANT = "nnUNetTrainerMedDisSeg", "nnUNetTrainerMedDisSeg_noDispersive"
#: the plans every run trains on: nnUNetPlans with the command's budget
PLANS = budget_plans_name("nnUNetPlans", {"num_epochs": 4, "iterations_per_epoch": 1, "val_iterations_per_epoch": 1,
                                          "final_validation": False})


def model_folder(out: Path, seed: int, trainer: str) -> Path:
    return out / f"seed_{seed}" / "nnUNet_results" / DATASET / f"{trainer}__{PLANS}__2d"


def ablate_command(out: Path) -> list:
    return [str(BIN / "nnUNetv2_meddisseg_ablate"), "-d", "501", "--variants", "noDispersive", "--seeds", "1",
            "--epochs", "4", "--iterations_per_epoch", "1", "--val_iterations", "1", "-o", str(out),
            "--device", "cpu", "--disable_tta", "--predict_processes", "0"]


@pytest.fixture(scope="module")
def ablation(preprocessed_synthetic, request, tmp_path_factory):
    """(environment, output folder, stdout of the rerun) of the killed and resumed ablation; deleted after
    the module's last test."""
    tmp = scratch_folder(request, tmp_path_factory, "ablate")
    env = {**preprocessed_synthetic, "nnUNet_results": str(tmp / "results")}
    out = tmp / "ablation"
    stage1_checkpoint = model_folder(out, 0, VARIANT) / "fold_0" / "checkpoint_latest.pth"
    run_until(ablate_command(out), env, tmp / "first.log", stage1_checkpoint)
    first = (tmp / "first.log").read_text()
    assert f"[1/2] {FULL} seed 0: training; time left known after the first run" in first
    assert f"[2/2] {VARIANT} seed 0: training; about " in first  # an estimate from the first run
    finished = out / "seed_0" / "runs" / f"{FULL}.json"
    finished_mtime = finished.stat().st_mtime_ns
    proc = subprocess.run(ablate_command(out), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert finished.stat().st_mtime_ns == finished_mtime  # not redone
    return env, out, proc.stdout


def test_ablate_resumes_after_kill_and_writes_the_table(ablation):
    env, out, rerun = ablation
    assert f"[1/2] {FULL} seed 0: finished earlier, skipped" in rerun
    assert f"[2/2] {VARIANT} seed 0: resuming the interrupted training (--c)" in rerun
    train_log = (out / "logs" / f"{VARIANT}_seed0_train.log").read_text()
    commands = [line for line in train_log.splitlines() if line.startswith("$ nnUNetv2_train")]
    assert len(commands) == 2 and not commands[0].endswith("--c") and commands[1].endswith("--c")
    for seed in (0,):
        for trainer in (FULL, VARIANT):
            final = torch.load(model_folder(out, seed, trainer) / "fold_0" / "checkpoint_final.pth",
                               map_location="cpu", weights_only=False)
            assert final["run_seed"] == seed and final["current_epoch"] == 4
            cbat_keys = [k for k in final["network_weights"] if k.startswith("decoder.small.cbat.")]
            assert final["trainer_name"] == trainer
            # a recipe variant trains the same network (the run's plans): CBAT ends each decoding path
            assert any(".channel." in k for k in cbat_keys) and "decoder.small.cbat.conv.weight" not in cbat_keys
    with open(out / "ablation.csv", newline="") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert list(rows) == [FULL, VARIANT]
    for name, row in rows.items():
        assert row["seeds"] == "1" and float(row["seconds_per_run"]) > 0
        for metric in ("iou", "dice", "recall", "precision"):
            assert 0.0 <= float(row[f"{metric}_mean"]) <= 1.0 and row[f"{metric}_sd"] == ""  # one seed: no sd
    assert rows[FULL]["dice_diff"] == "" and rows[FULL]["dice_p"] == ""
    assert 0.0 <= float(rows[VARIANT]["dice_p"]) <= 1.0
    markdown = (out / "ablation.md").read_text()
    assert "| Variant | Seeds | mIoU | mDSC | Recall | Precision |" in markdown
    assert "4 epochs x 1 iterations" in markdown and f"| {VARIANT} | 1 |" in markdown


def test_features_cli_draws_the_trained_pair(ablation, tmp_path):
    env, out, _ = ablation
    env = {**env, "nnUNet_results": str(out / "seed_0" / "nnUNet_results")}
    png = tmp_path / "features.png"
    proc = subprocess.run([str(BIN / "nnUNetv2_meddisseg_features"), "-d", "501", "-tr", FULL,
                           "-tr", VARIANT, "-p", PLANS, "--layer", "early", "--device", "cpu",
                           "-o", str(png)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for trainer in (FULL, VARIANT):
        assert f"{trainer}: mean pairwise distance " in proc.stdout and "(4 test images" in proc.stdout
