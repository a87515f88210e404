"""benchmarks/quality.py's equal-images / equal-minutes study through the real commands, on the CPU, at the
smallest useful size: a generated Kvasir-SEG-layout folder (the first cases of the shipped split, 32x32),
default nnU-Net and nnU-Net + dispersive loss (small networks, small checkpoints: the study does not depend
on the trainer) at their plans' batch, 4 epochs, one seed. The first command is killed (kill -9, as when a
GPU lease ends) during the second method's equal-images training; the second command resumes it with
``--c``, calibrates and runs the equal-minutes budget, and extends the results file the first one wrote."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nnunet_cli import fake_kvasir, run_until
from scratch import scratch_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quality  # noqa: E402
import quality_study  # noqa: E402
from quality_budgets import Budget, iterations_per_epoch, parse_budget  # noqa: E402

from nnunetv2_meddisseg.ablation.runs import Variant  # noqa: E402
from nnunetv2_meddisseg.errors import UserError  # noqa: E402
from nnunetv2_meddisseg.logged_command import CommandStopped  # noqa: E402

pytestmark = pytest.mark.e2e

QUALITY = Path(__file__).resolve().parents[2] / "benchmarks" / "quality.py"
EPOCHS, IMAGES, MINUTES = 4, 16, 0.5


def study_command(kvasir: Path, work: Path, out: Path) -> list:
    return [sys.executable, str(QUALITY), "--kvasir", str(kvasir), "--size", "32", "--budget", f"images:{IMAGES}",
            "--budget", f"minutes:{MINUTES}", "--epochs", str(EPOCHS), "--methods", "default", "dispersive",
            "--seeds", "1", "--val-iterations", "1", "--no-final-validation", "--disable-tta",
            "--max-train-cases", "6", "--max-test-cases", "2", "--num-processes", "1", "--da-processes", "0",
            "--threads", "1", "--work", str(work), "--out", str(out), "--name", "q"]


@pytest.fixture(scope="module")
def study(request, tmp_path_factory):
    """(work folder, results folder, stdout of the second command)."""
    # data of its own: quality.py converts and preprocesses a Kvasir-SEG-layout folder itself, as it does for users
    tmp = scratch_folder(request, tmp_path_factory, "quality_budgets")
    kvasir, work, out = fake_kvasir(tmp / "Kvasir-SEG", (6, 2, 2)), tmp / "work", tmp / "results"
    command = study_command(kvasir, work, out)

    def second_checkpoint():
        return any(work.glob("runs_images16_e4/dispersive/seed_0/nnUNet_results/*/*/fold_0/checkpoint_latest.pth"))

    run_until(command, dict(os.environ), tmp / "first.log", second_checkpoint)
    first = json.loads((out / "q.json").read_text())
    assert [(r["budget"], r["method"]) for r in first["runs"]] == [("images16", "default")]
    assert first["complete"] is False
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, out, proc.stdout


def test_the_killed_run_resumes_and_the_results_file_is_extended(study):
    work, out, stdout = study
    assert "start dispersive_seed0 (resuming the interrupted training with --c)" in stdout
    log = (work / "runs_images16_e4" / "dispersive" / "logs" / "dispersive_seed0_train.log").read_text()
    commands = [line for line in log.splitlines() if line.startswith("$ nnUNetv2_train")]
    assert len(commands) == 2 and not commands[0].endswith("--c") and commands[1].endswith("--c")
    results = json.loads((out / "q.json").read_text())
    assert results["complete"] is True and results["pending"] == []
    assert sorted((r["budget"], r["method"], r["seed"]) for r in results["runs"]) == [
        ("images16", "default", 0), ("images16", "dispersive", 0), ("minutes0.5", "default", 0),
        ("minutes0.5", "dispersive", 0)]
    assert len(results["pieces"]) == 2  # the killed command's piece and this one
    markdown = (out / "q.md").read_text()
    assert "### 16 training images per run" in markdown and "### 0.5 training minutes per run" in markdown


def test_equal_images_runs_see_the_budget_at_their_plans_batch(study):
    work, out, _ = study
    results = json.loads((out / "q.json").read_text())
    for r in results["runs"]:
        budget = json.loads((work / f"runs_{r['budget']}_e4" / r["method"] / "budget.json").read_text())
        assert budget["num_epochs"] == EPOCHS and budget["save_every"] == 1
        assert budget["iterations_per_epoch"] == r["iterations_per_epoch"]
        assert r["images_seen"] == EPOCHS * r["iterations_per_epoch"] * r["batch"]
        assert len(r["epoch_seconds"]) == EPOCHS and r["train_wall_s"] == pytest.approx(sum(r["epoch_seconds"]))
        if r["budget"] == "images16":
            assert r["iterations_per_epoch"] == math.ceil(IMAGES / (r["batch"] * EPOCHS))
            assert r["images_seen"] >= IMAGES
    table = results["tables"]["images16"]
    assert table["dispersive"]["seeds"] == [0] and "vs_baseline" in table["dispersive"]
    assert 0 <= table["dispersive"]["test"]["dice"]["mean"] <= 1


def test_equal_minutes_iterations_come_from_the_equal_images_run(study):
    _, out, _ = study
    runs = {(r["budget"], r["method"]): r for r in json.loads((out / "q.json").read_text())["runs"]}
    for method in ("default", "dispersive"):
        calibration = runs[("images16", method)]
        seconds = calibration["epoch_seconds"]
        median = sorted(seconds)[1:3]
        median = (median[0] + median[1]) / 2  # four epochs
        overhead = sum(max(0.0, s - median) for s in seconds)
        steady = sum(seconds) - overhead
        expected = math.floor(calibration["iterations_per_epoch"] * (60 * MINUTES - overhead) / steady)
        assert runs[("minutes0.5", method)]["iterations_per_epoch"] == expected


def test_iterations_per_epoch_by_hand():
    assert iterations_per_epoch(Budget("iterations", 2000, 4), 40, 4) == 50
    assert iterations_per_epoch(Budget("images", 16), 4, 2) == 2
    assert iterations_per_epoch(Budget("images", 17), 4, 2) == 3
    # median 5 s: 20 s overhead (the compiling first epoch), 20 s for 4 epochs of 2 iterations
    calibration = {"epoch_seconds": [25.0, 5.0, 5.0, 5.0], "iterations_per_epoch": 2}
    assert iterations_per_epoch(Budget("minutes", 1), 4, 2, calibration) == 4  # 2 * 40 / 20
    with pytest.raises(UserError, match="minutes:0.3 is too small"):
        iterations_per_epoch(Budget("minutes", 0.3), 4, 2, calibration)  # 18 s < 20 s overhead


def test_budget_option_and_results_file_errors(tmp_path):
    assert parse_budget("images:880") == ("images", 880.0, None)
    assert parse_budget("iterations:2000")._replace(batch=4).label == "iterations2000_bs4"
    for bad in ("images", "images:0", "hours:2", "minutes:nan"):
        with pytest.raises(Exception, match="expected iterations:N, images:N or minutes:M"):
            parse_budget(bad)
    path = tmp_path / "q.json"
    assert quality._previous_results(path, {"size": 256}) == {}
    path.write_text(json.dumps({"settings": {"size": 64, "epochs": 20}, "runs": []}))
    with pytest.raises(SystemExit, match=r"other settings \(epochs, size\)"):
        quality._previous_results(path, {"size": 256})
    pretraining = {"epochs": 4, "batch": 4, "fold": "0", "iterations_per_epoch": 20}
    path.write_text(json.dumps({"settings": {"size": 64, "pretraining": pretraining}, "runs": []}))
    assert quality._previous_results(path, {"size": 64}, pretraining)["runs"] == []  # scratch arms extend the study
    with pytest.raises(SystemExit, match=r"other settings \(pretraining\)"):
        quality._previous_results(path, {"size": 64}, {**pretraining, "epochs": 8})
    path.write_text('{"settings": ')
    with pytest.raises(SystemExit, match="q.json is not valid JSON"):
        quality._previous_results(path, {"size": 256})


@pytest.mark.parametrize("argv, message", [
    (["--iterations", "100", "--iterations-per-epoch", "30"], r"--iterations \(100\) must be a positive multiple"),
    (["--budget", "iterations:100", "--epochs", "30"], r"iterations:100 must be a multiple of --epochs \(30\)"),
    (["--budget", "images:100", "--epochs", "3"], "--epochs must be at least 4"),
    (["--iterations-per-epoch", "5"], "--iterations-per-epoch needs --iterations"),
    (["--piece-min", "0"], "--piece-min must be a number of minutes above 0"),
])
def test_budget_command_line_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        quality.main(["--kvasir", "/nonexistent", *argv])


class _Runner:
    """An AblationRun stand-in whose training is still running when the piece ends."""

    variants = {"default": Variant("nnUNetTrainerBaseline", "nnUNetPlans")}

    def __init__(self):
        self.time_limits = []

    def state(self, key, seed):
        return "interrupted"

    def train(self, key, seed, time_limit_s):
        self.time_limits.append(time_limit_s)
        raise CommandStopped("stopped at its time limit")


def test_a_piece_ends_a_running_training_and_starts_nothing_after():
    import time

    runner = _Runner()
    result = quality_study.Study(hard=time.time() + 60).run(runner, "default", 0)
    assert result["status"] == "stopped at the end of the piece" and 0 < runner.time_limits[0] <= 60
    assert quality_study.Study(hard=time.time() - 1).run(runner, "default", 1)["status"] == "not started (deadline)"
    assert len(runner.time_limits) == 1


class _TrainedRunner:
    """A run already trained: its checkpoint's epoch times and nnU-Net's final validation summary on disk."""
    variants = {"default": Variant("nnUNetTrainerBaseline", "nnUNetPlans")}

    def __init__(self, folder):
        import torch

        self.folder, self.out = folder, folder
        (folder / "validation").mkdir(parents=True)
        torch.save({"logging": {"epoch_start_timestamps": [0.0, 10.0], "epoch_end_timestamps": [4.0, 16.0]}},
                   folder / "checkpoint_final.pth")
        cases = [{"reference_file": f"/gt/case{i}.png", "metrics": {"1": {"Dice": d, "IoU": d / (2 - d)}}}
                 for i, d in enumerate((0.5, 0.8))]
        (folder / "validation" / "summary.json").write_text(json.dumps(
            {"foreground_mean": {"Dice": 0.65}, "metric_per_case": cases}))

    def state(self, key, seed):
        return "trained"

    def fold_folder(self, key, seed):
        return self.folder

    def predict_and_evaluate(self, *args):
        raise AssertionError("a validation-only study predicts no test image")


def test_a_validation_only_run_takes_nnunets_final_validation_and_predicts_nothing(tmp_path):
    result = quality_study.Study(validation_only=True).run(_TrainedRunner(tmp_path / "fold_0"), "default", 0)
    assert result["status"] == "done" and "test_mean" not in result and "test_per_case" not in result
    assert result["val_dice"] == 0.65 and result["train_wall_s"] == 10.0
    assert result["val_per_case"] == {"case0": {"dice": 0.5, "iou": 0.5 / 1.5},
                                      "case1": {"dice": 0.8, "iou": 0.8 / 1.2}}
