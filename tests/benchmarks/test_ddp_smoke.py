"""benchmarks/device/ddp_smoke.py without GPUs: its commands, its refusal to run short of GPUs, and its
checks of a training log (written here by a real trainer on the CPU)."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from tests.training.test_trainer_meddisseg import (PLAIN_UNET, make_batch, make_trainer, nnunet_dirs,  # noqa: F401
                                                   run_epoch, tiny_plans)

DEVICE_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "device"


def _smoke():
    spec = importlib.util.spec_from_file_location("ddp_smoke", DEVICE_DIR / "ddp_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_writes_the_num_gpus_commands(tmp_path):
    smoke = _smoke()
    assert smoke.main([str(tmp_path / "out"), "--dry-run", "--num-gpus", "3", "--scratch", str(tmp_path / "s")]) == 0
    results = json.loads((tmp_path / "out" / "ddp_smoke.json").read_text())
    assert results["status"] == "not run" and results["reason"] == "--dry-run"
    commands = results["commands"]
    assert [c.split()[0].rsplit("/", 1)[-1] for c in commands] == [
        "nnUNetv2_plan_and_preprocess", "nnUNetv2_meddisseg_plan", "nnUNetv2_train", "nnUNetv2_train"]
    assert commands[1].endswith("--batch-size 6")  # two samples per GPU
    assert all(c.endswith("-num_gpus 3") for c in commands[2:])
    assert "-tr nnUNetTrainerMedDisSeg_smoke -p nnUNetMedDisSegPlans" in commands[2]
    assert "-tr nnUNetTrainerDispersive_smoke -p nnUNetPlans" in commands[3]
    for command in commands:  # the shims exist and run this interpreter
        assert Path(command.split()[0]).is_file()
    assert "-num_gpus 3" in (tmp_path / "out" / "ddp_smoke.md").read_text()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs: the run would start")
def test_short_of_gpus_nothing_runs(tmp_path):
    smoke = _smoke()
    assert smoke.main([str(tmp_path / "out"), "--scratch", str(tmp_path / "s")]) == 2
    results = json.loads((tmp_path / "out" / "ddp_smoke.json").read_text())
    assert results["status"] == "not run"
    assert results["reason"] == f"needs 2 CUDA GPUs, found {torch.cuda.device_count()}"
    assert not list((tmp_path / "s" / "nnUNet_raw").iterdir())  # no dataset generated


def test_log_checks_on_a_real_training_log(nnunet_dirs):
    smoke = _smoke()
    torch.manual_seed(0)
    trainer = make_trainer(nnUNetTrainerDispersive, plans=tiny_plans(PLAIN_UNET))
    batch = make_batch()
    batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    run_epoch(trainer, batch)
    log = Path(trainer.log_file).read_text()
    terms = smoke.loss_terms(log)
    assert len(terms) == 1 and set(terms[0]) == {"seg", "dispersive"}
    assert terms[0]["dispersive"] == pytest.approx(trainer.curves.get("loss_dispersive", 0), abs=1e-4)
    assert smoke.check_training(log, True, meddisseg=False, epochs=1) == []
    assert smoke.check_training(log, False, meddisseg=True, epochs=2) == [
        "no checkpoint_final.pth", "loss terms logged for 1 epochs, expected 2", "Stage II never started"]
    broken = log.replace(f"dispersive {terms[0]['dispersive']:.4f}", "dispersive nan")
    assert math.isnan(smoke.loss_terms(broken)[0]["dispersive"])
    assert smoke.check_training(broken + "\nWARNING: the dispersive loss (x) sees 1 sample(s)", True, False, 1) == [
        "a loss term is not finite", "the dispersive loss sees too few samples (start-up warning)"]
