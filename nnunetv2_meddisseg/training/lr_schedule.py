"""Learning-rate schedule for optimizers with several parameter groups of different base rates.

nnU-Net's ``PolyLRScheduler`` writes one learning rate into every parameter group. Med-DisSeg's
Stage II trains the encoder at 1e-5 and the rest at 1e-4, so each group must decay from its own
base rate: ``lr_g(e) = base_g * (1 - (e - start) / length) ** exponent`` for the epochs ``e`` of one
stage ``[start, start + length)``. :class:`PerGroupCosineLRScheduler` decays the same way along a
half cosine, ``lr_g(e) = base_g * (1 + cos(pi * (e - start) / length)) / 2`` (the paper's schedule).
"""
import math
from typing import Dict, List, Optional, Sequence

import torch

__all__ = ["poly_lr", "cosine_lr", "PerGroupPolyLRScheduler", "PerGroupCosineLRScheduler"]


def poly_lr(base_lr: float, step: int, total_steps: int, exponent: float = 0.9) -> float:
    """``base_lr * (1 - step / total_steps) ** exponent``, ``step`` clamped to ``[0, total_steps]``."""
    if total_steps < 1:
        raise ValueError(f"poly_lr: total_steps must be >= 1, got {total_steps}")
    step = min(max(step, 0), total_steps)
    return base_lr * (1.0 - step / total_steps) ** exponent


def cosine_lr(base_lr: float, step: int, total_steps: int) -> float:
    """``base_lr * (1 + cos(pi * step / total_steps)) / 2``, ``step`` clamped to ``[0, total_steps]``."""
    if total_steps < 1:
        raise ValueError(f"cosine_lr: total_steps must be >= 1, got {total_steps}")
    step = min(max(step, 0), total_steps)
    return base_lr * (1.0 + math.cos(math.pi * step / total_steps)) / 2.0


class PerGroupPolyLRScheduler:
    """Polynomial decay of every parameter group from its own base learning rate, within one stage.

    Args:
        optimizer: the optimizer whose groups are scheduled.
        base_lrs: one base rate per parameter group (in group order).
        start_epoch: first epoch of the stage (its rate is ``base_lr``).
        num_epochs: length of the stage in epochs.
        exponent: poly exponent (nnU-Net: 0.9).

    Used like nnU-Net's scheduler: ``step(current_epoch)`` at the start of every epoch.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, base_lrs: Sequence[float], start_epoch: int,
                 num_epochs: int, exponent: float = 0.9) -> None:
        if len(base_lrs) != len(optimizer.param_groups):
            raise ValueError(f"PerGroupPolyLRScheduler: {len(base_lrs)} base_lrs for "
                             f"{len(optimizer.param_groups)} parameter groups")
        if num_epochs < 1:
            raise ValueError(f"PerGroupPolyLRScheduler: num_epochs must be >= 1, got {num_epochs}")
        self.optimizer = optimizer
        self.base_lrs = [float(lr) for lr in base_lrs]
        self.start_epoch = int(start_epoch)
        self.num_epochs = int(num_epochs)
        self.exponent = float(exponent)
        self.last_epoch = self.start_epoch - 1
        self._last_lr: List[float] = [group["lr"] for group in optimizer.param_groups]

    def lrs_at(self, epoch: int) -> List[float]:
        """The learning rate of every group at ``epoch`` (without changing the optimizer)."""
        return [poly_lr(base, epoch - self.start_epoch, self.num_epochs, self.exponent) for base in self.base_lrs]

    def step(self, current_epoch: Optional[int] = None) -> None:
        """Set every group's rate for ``current_epoch`` (default: the epoch after the last step)."""
        if current_epoch is None or current_epoch == -1:
            current_epoch = self.last_epoch + 1
        self.last_epoch = int(current_epoch)
        for group, lr in zip(self.optimizer.param_groups, self.lrs_at(self.last_epoch)):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> List[float]:
        return list(self._last_lr)

    def state_dict(self) -> Dict[str, object]:
        return {"base_lrs": list(self.base_lrs), "start_epoch": self.start_epoch, "num_epochs": self.num_epochs,
                "exponent": self.exponent, "last_epoch": self.last_epoch}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        self.base_lrs = [float(lr) for lr in state["base_lrs"]]
        self.start_epoch = int(state["start_epoch"])
        self.num_epochs = int(state["num_epochs"])
        self.exponent = float(state["exponent"])
        self.last_epoch = int(state["last_epoch"])


class PerGroupCosineLRScheduler(PerGroupPolyLRScheduler):
    """Cosine decay of every parameter group from its own base learning rate to 0 over one stage;
    otherwise as :class:`PerGroupPolyLRScheduler` (``exponent`` is kept for its state dict, unused)."""

    def lrs_at(self, epoch: int) -> List[float]:
        return [cosine_lr(base, epoch - self.start_epoch, self.num_epochs) for base in self.base_lrs]
