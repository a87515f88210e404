"""Per-group poly and cosine learning-rate schedules: values worked out by hand or from the closed formula."""
import inspect
import math

import pytest
import torch
from torch.optim.lr_scheduler import LRScheduler

from nnunetv2_meddisseg.training.lr_schedule import PerGroupCosineLRScheduler, PerGroupPolyLRScheduler, poly_lr


def _optimizer(lrs):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.Adam(groups)


def test_poly_lr_values():
    assert poly_lr(1e-4, 0, 10) == pytest.approx(1e-4)
    assert poly_lr(1e-4, 5, 10) == pytest.approx(1e-4 * 0.5 ** 0.9)
    assert poly_lr(2.0, 9, 10, exponent=1.0) == pytest.approx(0.2)
    # clamped outside [0, total]
    assert poly_lr(1.0, -3, 10) == pytest.approx(1.0)
    assert poly_lr(1.0, 12, 10) == 0.0
    with pytest.raises(ValueError):
        poly_lr(1.0, 0, 0)


def test_each_group_decays_from_its_own_base():
    optimizer = _optimizer([1e-4, 1e-5])
    scheduler = PerGroupPolyLRScheduler(optimizer, [1e-4, 1e-5], start_epoch=250, num_epochs=750)
    for epoch in (250, 251, 600, 999):
        scheduler.step(epoch)
        t = (epoch - 250) / 750
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * (1 - t) ** 0.9)
        assert optimizer.param_groups[1]["lr"] == pytest.approx(1e-5 * (1 - t) ** 0.9)
        # the ratio of the two groups never changes (nnU-Net's PolyLRScheduler would make it 1)
        assert optimizer.param_groups[0]["lr"] / optimizer.param_groups[1]["lr"] == pytest.approx(10.0)
    assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]


def test_step_without_epoch_counts_on_and_base_lrs_survive_optimizer_state_loading():
    optimizer = _optimizer([1.0, 0.1])
    scheduler = PerGroupPolyLRScheduler(optimizer, [1.0, 0.1], start_epoch=0, num_epochs=4, exponent=1.0)
    scheduler.step()  # epoch 1 (construction set epoch 0's rates, as torch's schedulers do)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.75, 0.075])
    scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.5, 0.05])
    # loading an optimizer state overwrites the groups' lr; the schedule restores the right values
    state = optimizer.state_dict()
    fresh = _optimizer([1.0, 0.1])
    fresh_scheduler = PerGroupPolyLRScheduler(fresh, [1.0, 0.1], start_epoch=0, num_epochs=4, exponent=1.0)
    fresh.load_state_dict(state)
    fresh_scheduler.step(2)
    assert [g["lr"] for g in fresh.param_groups] == pytest.approx([0.5, 0.05])


def test_mismatched_groups_are_rejected():
    with pytest.raises(ValueError, match="base_lrs"):
        PerGroupPolyLRScheduler(_optimizer([1.0, 0.1]), [1.0], 0, 10)


def test_cosine_is_its_own_scheduler_with_the_closed_formula():
    assert issubclass(PerGroupCosineLRScheduler, LRScheduler)
    assert not issubclass(PerGroupCosineLRScheduler, PerGroupPolyLRScheduler)
    assert "exponent" not in inspect.signature(PerGroupCosineLRScheduler).parameters
    optimizer = _optimizer([0.5, 0.5])  # the rates the groups hold before the scheduler is built
    scheduler = PerGroupCosineLRScheduler(optimizer, [1e-4, 1e-5], start_epoch=75, num_epochs=225)
    assert not hasattr(scheduler, "exponent")
    assert [g["lr"] for g in optimizer.param_groups] == [1e-4, 1e-5]  # construction: the stage's first epoch
    for epoch in (75, 76, 100, 187, 299, 300, 320):
        scheduler.step(epoch)
        t = min(epoch - 75, 225) / 225
        expected = [base * (1 + math.cos(math.pi * t)) / 2 for base in (1e-4, 1e-5)]
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(expected, rel=1e-12, abs=1e-20)
        assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]
    # torch's state dict: a scheduler restored from it continues where the first one was
    restored = PerGroupCosineLRScheduler(_optimizer([1.0, 1.0]), [1.0, 1.0], start_epoch=0, num_epochs=3)
    restored.load_state_dict(scheduler.state_dict())
    scheduler.step()
    restored.step()
    assert restored.get_last_lr() == scheduler.get_last_lr()
    assert restored.lrs_at(100) == scheduler.lrs_at(100)


def test_poly_and_cosine_start_and_end_alike():
    for cls in (PerGroupPolyLRScheduler, PerGroupCosineLRScheduler):
        optimizer = _optimizer([1.0, 0.1])
        scheduler = cls(optimizer, [1.0, 0.1], start_epoch=10, num_epochs=5)
        assert scheduler.lrs_at(10) == [1.0, 0.1] and scheduler.lrs_at(15) == pytest.approx([0.0, 0.0], abs=1e-15)
        with pytest.raises(ValueError, match=f"{cls.__name__}: num_epochs must be >= 1"):
            cls(optimizer, [1.0, 0.1], 0, 0)
