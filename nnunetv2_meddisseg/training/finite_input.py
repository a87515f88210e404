"""Checks of a batch's input for NaN / inf, with an error message naming the offending cases."""
from typing import Optional, Sequence

import torch

from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

__all__ = ["finite_per_sample", "non_finite_input_message", "check_finite_input"]


def finite_per_sample(data: torch.Tensor) -> torch.Tensor:
    """data: (B, C, ...) -> (B,) bool on data's device, True where the sample holds no NaN / inf (no sync)."""
    return torch.isfinite(data.detach().reshape(data.shape[0], -1)).all(dim=1)


def non_finite_input_message(finite: Sequence[bool], keys: Optional[Sequence[str]] = None, where: str = "") -> str:
    """The error message naming the samples whose ``finite`` flag is False (by case key where given)."""
    bad = [i for i, ok in enumerate(finite) if not ok]
    if keys is not None and len(keys) == len(finite):
        cases = ", ".join(str(keys[i]) for i in bad)
    else:
        cases = "batch positions " + ", ".join(map(str, bad))
    return (f"input with NaN or inf values{where}: {cases}. Check these cases' images (and their "
            f"preprocessed files in nnUNet_preprocessed): training on them would give a NaN model.")


def check_finite_input(data: torch.Tensor, keys: Optional[Sequence[str]] = None, where: str = "") -> None:
    """Raise a :class:`TrainingInputRuntimeError` (a ``RuntimeError``) naming the offending cases if ``data``
    (B, C, ...) holds NaN or inf.

    keys: the case identifiers of the batch (nnU-Net's dataloader gives them as ``batch['keys']``).
    """
    finite = finite_per_sample(data)
    if bool(finite.all()):
        return
    raise TrainingInputRuntimeError(non_finite_input_message(finite.tolist(), keys, where))
