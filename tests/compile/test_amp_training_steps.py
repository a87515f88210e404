"""One Stage I and one Stage II training step of nnUNetTrainerMedDisSeg under mixed precision with a
GradScaler, the way nnU-Net trains on CUDA (``autocast`` around forward and loss; ``scale(loss).backward``,
``unscale_``, gradient clipping, ``step``, ``update``), run on CPU: autocast in bf16 (CPU autocast's
usual type) and in fp16 (the type nnU-Net uses on CUDA), with ``torch.amp.GradScaler("cpu")``.

The trainer is built in-process from a hand-written 32x32 plan (MedDisSegNet with its default
arguments: ELAT, TeLU, fusion "sum") and fed one batch through the hooks ``run_training`` calls.
"""
import math
from copy import deepcopy
from dataclasses import replace

import pytest
import torch

from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_smoke
from tests.training.test_trainer_meddisseg import DATASET, DATASET_JSON, tiny_plans

#: A scale at which the scaled fp16 gradients fit. In Stage II the first convolution's gradient is
#: about 200 here, and its fp16 accumulation overflows from a scale of 2**8 on: GradScaler then skips
#: the step and halves the scale (nnU-Net starts at 2**16 and lets it back off; tested below).
INIT_SCALE = 2.0 ** 4


def _plans() -> dict:
    # nnU-Net's default network in the plans: the trainer builds MedDisSegNet with its default arguments
    plans = tiny_plans()
    plans["continue_training"] = False
    return plans


def _batch(b=2, size=32):
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(b, 1, size, size)
    target[:, :, 4:14, 4:14] = 1
    target[:, :, 18:28, 16:30] = 2
    return {"data": torch.randn(b, 3, size, size, generator=g), "target": target,
            "keys": [f"case_{i:03d}" for i in range(b)]}


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    preprocessed = tmp_path / "preprocessed" / DATASET / "nnUNetPlans_2d"
    preprocessed.mkdir(parents=True)
    (preprocessed / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    monkeypatch.setenv("nnUNet_preprocessed", str(tmp_path / "preprocessed"))
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "results"))
    monkeypatch.setenv("nnUNet_meddisseg_seed", "0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    trainer = nnUNetTrainerMedDisSeg_smoke(plans=_plans(), configuration="2d", fold=0,
                                           dataset_json=deepcopy(DATASET_JSON), device=torch.device("cpu"))
    trainer.initialize()
    # re-estimation needs a dataset (tests/training/test_trainer_batchnorm.py)
    trainer.recipe = replace(trainer.recipe, batchnorm_calibration_samples=0)
    yield trainer
    torch.set_num_threads(threads)


def _use_amp(trainer, monkeypatch, dtype: torch.dtype) -> None:
    """What nnU-Net sets up on CUDA, on CPU: autocast in ``dtype`` and a GradScaler."""
    monkeypatch.setattr(trainer, "autocast", torch.autocast("cpu", dtype=dtype))
    trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)


def _check_step(trainer, out: dict, before: dict) -> None:
    assert math.isfinite(float(out["loss"]))
    assert all(math.isfinite(v) for k, v in out.items() if k.startswith("loss_")), out
    # no inf / NaN gradient was found: the scale was not backed off and the step was taken
    assert trainer.grad_scaler.get_scale() == INIT_SCALE
    for group in trainer.optimizer.param_groups:
        params = group["params"]
        missing = [i for i, p in enumerate(params) if p.grad is None]
        assert not missing, f"group {group['name']}: {len(missing)} of {len(params)} parameters got no gradient"
        bad = [i for i, p in enumerate(params) if not torch.isfinite(p.grad).all()]
        assert not bad, f"group {group['name']}: non-finite gradients in parameters {bad}"
        assert any(float(p.grad.abs().sum()) > 0 for p in params), f"group {group['name']}: all gradients zero"
        moved = sum(not torch.equal(p.detach(), before[id(p)]) for p in params)
        assert moved > 0, f"group {group['name']}: no parameter changed"
    for p in trainer.network.parameters():
        assert torch.isfinite(p).all()


def _snapshot(trainer) -> dict:
    return {id(p): p.detach().clone() for g in trainer.optimizer.param_groups for p in g["params"]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_stage1_and_stage2_steps_under_autocast_and_grad_scaler(trainer, monkeypatch, dtype):
    _use_amp(trainer, monkeypatch, dtype)
    batch = _batch()

    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    assert trainer.training_stage == STAGE_1
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["head", "encoder"]
    before = _snapshot(trainer)
    out = trainer.train_step(batch)
    assert out["loss_dispersive"] < 0
    _check_step(trainer, out, before)

    trainer.current_epoch = trainer.stage1_epochs
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    assert trainer.training_stage == STAGE_2
    before = _snapshot(trainer)
    if dtype == torch.float16:
        # nnU-Net's initial scale: the scaled gradients overflow, the step is skipped, the scale halves
        trainer.grad_scaler = torch.amp.GradScaler("cpu")
        out = trainer.train_step(batch)
        assert math.isfinite(float(out["loss"]))
        assert trainer.grad_scaler.get_scale() == 2.0 ** 15
        assert all(torch.equal(p, before[id(p)]) for g in trainer.optimizer.param_groups for p in g["params"])
        trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE)
    out = trainer.train_step(batch)
    assert {"loss_seg_paths", "loss_fg_bg", "loss_complementarity", "loss_dispersive"} <= out.keys()
    _check_step(trainer, out, before)

    with torch.no_grad():
        trainer.on_validation_epoch_start()
        val = trainer.validation_step(batch)
    assert math.isfinite(float(val["loss"]))
