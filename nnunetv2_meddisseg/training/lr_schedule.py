"""Learning-rate schedules for parameter groups of different base rates.

nnU-Net's ``PolyLRScheduler`` writes one rate into every group; Med-DisSeg's Stage II trains the encoder at 1e-5 and
the rest at 1e-4, so each group decays from its own base over the epochs ``e`` of a stage ``[start, start + length)``:
``lr_g(e) = base_g * (1 - (e - start) / length) ** exponent``, or along the paper's half cosine
``lr_g(e) = base_g * (1 + cos(pi * (e - start) / length)) / 2``.
"""
import math
from typing import List, Optional, Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["poly_lr", "cosine_lr", "PerGroupStageLRScheduler", "PerGroupPolyLRScheduler", "PerGroupCosineLRScheduler"]


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


class PerGroupStageLRScheduler(LRScheduler):
    """Every parameter group decays from its own base rate (``base_lrs``, in group order) over one stage
    ``[start_epoch, start_epoch + num_epochs)``; subclasses give the decay (``lr``). Used like nnU-Net's
    ``PolyLRScheduler``: ``step(current_epoch)`` at the start of every epoch, ``step()`` moves on one epoch.
    Construction sets the rates of ``start_epoch``."""

    def __init__(self, optimizer: torch.optim.Optimizer, base_lrs: Sequence[float], start_epoch: int,
                 num_epochs: int) -> None:
        name = type(self).__name__
        if len(base_lrs) != len(optimizer.param_groups):
            raise ValueError(f"{name}: {len(base_lrs)} base_lrs for {len(optimizer.param_groups)} parameter groups")
        if num_epochs < 1:
            raise ValueError(f"{name}: num_epochs must be >= 1, got {num_epochs}")
        self.start_epoch = int(start_epoch)
        self.num_epochs = int(num_epochs)
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["initial_lr"] = float(base)  # torch's base_lrs
        super().__init__(optimizer, last_epoch=self.start_epoch - 1)

    def lr(self, base_lr: float, step: int) -> float:
        """The rate of a group with base rate ``base_lr`` ``step`` epochs into the stage."""
        raise NotImplementedError

    def lrs_at(self, epoch: int) -> List[float]:
        """The learning rate of every group at ``epoch`` (without changing the optimizer)."""
        return [self.lr(base, epoch - self.start_epoch) for base in self.base_lrs]

    def get_lr(self) -> List[float]:
        return self.lrs_at(self.last_epoch)

    def step(self, current_epoch: Optional[int] = None) -> None:
        """Set every group's rate for ``current_epoch`` (default: the epoch after the last step)."""
        if current_epoch is None or current_epoch == -1:
            current_epoch = self.last_epoch + 1
        self.last_epoch = int(current_epoch)
        for group, lr in zip(self.optimizer.param_groups, self.lrs_at(self.last_epoch)):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class PerGroupPolyLRScheduler(PerGroupStageLRScheduler):
    """Polynomial decay ``(1 - t) ** exponent`` (nnU-Net: 0.9) of every group from its own base rate over a stage."""

    def __init__(self, optimizer: torch.optim.Optimizer, base_lrs: Sequence[float], start_epoch: int,
                 num_epochs: int, exponent: float = 0.9) -> None:
        self.exponent = float(exponent)
        super().__init__(optimizer, base_lrs, start_epoch, num_epochs)

    def lr(self, base_lr: float, step: int) -> float:
        return poly_lr(base_lr, step, self.num_epochs, self.exponent)


class PerGroupCosineLRScheduler(PerGroupStageLRScheduler):
    """Half-cosine decay ``(1 + cos(pi t)) / 2`` of every group from its own base rate to 0 over a stage."""

    def lr(self, base_lr: float, step: int) -> float:
        return cosine_lr(base_lr, step, self.num_epochs)
