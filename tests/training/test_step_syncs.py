"""A training step synchronises with the device once: every logged value, the gradient norms and the
batch's NaN / inf check travel to the host in one transfer (nnU-Net's own step moves its loss)."""
import math

import pytest
import torch

from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from tests.training.test_trainer_meddisseg import (
    MEDDISSEG,
    PLAIN_UNET,
    make_batch,
    make_trainer,
    tiny_plans,
)

#: the Tensor methods that wait for the device (the values must be on the host)
SYNCHRONISING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


class SyncCounter:
    """Counts calls of :data:`SYNCHRONISING` methods, except on the optimizer's step counters (host
    tensors on every device, which torch's optimizers read as numbers) and on what ``.cpu()`` returned
    (already on the host)."""

    def __init__(self, monkeypatch, optimizer: torch.optim.Optimizer) -> None:
        self.calls = []
        self._optimizer = optimizer
        self._on_host = []
        for name in SYNCHRONISING:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, original))

    def _excluded(self, tensor) -> bool:
        return (any(tensor is t for t in self._on_host)
                or any(tensor is state.get("step") for state in self._optimizer.state.values()))

    def _counting(self, name, original):
        def method(tensor, *args, **kwargs):
            if self._excluded(tensor):
                return original(tensor, *args, **kwargs)
            self.calls.append(name)
            result = original(tensor, *args, **kwargs)
            if name == "cpu":
                self._on_host.append(result)
            return result
        return method


def _trainer(stage, cls=None, plans=None):
    stages = {} if stage is None else {"stage1_epochs": int(stage == STAGE_1)}
    trainer = make_trainer(**({} if cls is None else {"cls": cls}), plans=plans, num_epochs=2,
                           input_check_on_device=True, **stages)
    trainer.on_train_epoch_start()
    assert stage is None or trainer.training_stage == stage
    return trainer


@pytest.mark.parametrize("stage", [STAGE_1, STAGE_2])
def test_meddisseg_step_synchronises_once(nnunet_dirs, monkeypatch, stage):
    trainer = _trainer(stage, plans=tiny_plans(MEDDISSEG))
    batch = make_batch()
    first = trainer.train_step(batch)  # the epoch's first step also computes the dispersion diagnostics
    assert math.isfinite(first["dispersion_effective_rank"])
    counter = SyncCounter(monkeypatch, trainer.optimizer)
    result = trainer.train_step(batch)
    monkeypatch.undo()
    assert counter.calls == ["cpu"]
    assert result["loss"].shape == () and math.isfinite(float(result["loss"]))
    assert all(isinstance(result[k], float) for k in result if k.startswith(("loss_", "grad_norm_")))
    assert result["grad_norm_encoder"] > 0 and result[f"grad_norm_{'head' if stage == STAGE_1 else 'decoder'}"] > 0


def test_dispersive_step_synchronises_once(nnunet_dirs, monkeypatch):
    trainer = _trainer(None, cls=nnUNetTrainerDispersive, plans=tiny_plans(PLAIN_UNET))
    batch = make_batch()
    batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    trainer.train_step(batch)
    counter = SyncCounter(monkeypatch, trainer.optimizer)
    result = trainer.train_step(batch)
    monkeypatch.undo()
    assert counter.calls == ["cpu"]
    assert result["grad_norm_network"] > 0 and math.isfinite(result["loss_dispersive"])


def test_the_counter_sees_a_synchronising_call(nnunet_dirs, monkeypatch):
    trainer = _trainer(STAGE_2, plans=tiny_plans(MEDDISSEG))
    counter = SyncCounter(monkeypatch, trainer.optimizer)
    bool(torch.ones(1) > 0)
    torch.zeros(2).tolist()
    monkeypatch.undo()
    assert counter.calls == ["__bool__", "tolist"]


@pytest.mark.parametrize("on_device", [True, False])
def test_nan_batch_is_named_with_the_check_on_the_device_or_before_the_step(nnunet_dirs, on_device):
    trainer = make_trainer(num_epochs=2, input_check_on_device=on_device)
    trainer.on_train_epoch_start()
    batch = make_batch()
    batch["data"][1, 0, 3, 3] = float("inf")
    weights_before = trainer.network.encoder.conv1.weight.detach().clone()
    with pytest.raises(RuntimeError, match=r"NaN or inf.*training batch of epoch 0: case_001\."):
        trainer.train_step(batch)
    # checked before the step, the weights are untouched; on the device, the error ends the step that saw
    # the batch (whose update the run, stopped by the error, never saves)
    assert torch.equal(trainer.network.encoder.conv1.weight, weights_before) != on_device
