"""``nnUNet_meddisseg_bf16``: training steps under bf16 autocast without a GradScaler (here on the CPU)."""
import math

import pytest
import torch

from nnunetv2_meddisseg.environment import BF16_ENVIRONMENT_VARIABLE
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from tests.training.test_trainer_meddisseg import MEDDISSEG, make_batch, make_trainer, tiny_plans


@pytest.mark.e2e  # the whole network trained through a trainer (the quick loop leaves it out)
@pytest.mark.parametrize("stage", [STAGE_1, STAGE_2])
def test_step_under_bf16_autocast_without_grad_scaler(nnunet_dirs, monkeypatch, stage):
    monkeypatch.setenv(BF16_ENVIRONMENT_VARIABLE, "1")
    trainer = make_trainer(plans=tiny_plans(MEDDISSEG), num_epochs=2, stage1_epochs=int(stage == STAGE_1))
    assert trainer.bf16 and trainer.grad_scaler is None
    trainer.on_train_epoch_start()
    assert trainer.training_stage == stage
    seen = []
    hook = trainer.network.encoder.layer1.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    weights = {n: p.detach().clone() for n, p in trainer.network.named_parameters()}
    result = trainer.train_step(make_batch())
    hook.remove()
    assert seen == [torch.bfloat16]
    assert math.isfinite(float(result["loss"])) and all(math.isfinite(v) for k, v in result.items()
                                                         if k.startswith(("loss_", "grad_norm_")))
    assert result["grad_norm_encoder"] > 0
    changed = {n for n, p in trainer.network.named_parameters() if not torch.equal(p, weights[n])}
    assert "encoder.conv1.weight" in changed
    assert ("decoder.small.project.conv.weight" in changed) == (stage == STAGE_2)
    assert all(p.dtype == torch.float32 for p in trainer.network.parameters())  # fp32 master weights
    with torch.no_grad():
        trainer.on_validation_epoch_start()
        assert math.isfinite(float(trainer.validation_step(make_batch())["loss"]))


def test_default_keeps_nnunet_precision(nnunet_dirs, monkeypatch):
    monkeypatch.delenv(BF16_ENVIRONMENT_VARIABLE, raising=False)
    trainer = make_trainer(plans=tiny_plans(MEDDISSEG), num_epochs=2, initialize=False)
    assert not trainer.bf16
    with trainer.autocast:
        assert not torch.is_autocast_enabled("cpu")  # nnU-Net: no autocast on the CPU
    monkeypatch.setenv(BF16_ENVIRONMENT_VARIABLE, "true")
    trainer = make_trainer(plans=tiny_plans(MEDDISSEG), num_epochs=2, initialize=False)
    with trainer.autocast:
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
