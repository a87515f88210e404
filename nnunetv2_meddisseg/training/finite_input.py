"""Checks of a batch's input for NaN / inf, with an error message naming the offending cases."""
from typing import Callable, Optional, Sequence, Union

import torch

from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

__all__ = ["Where", "finite_per_sample", "non_finite_input_message", "check_finite_input"]


def finite_per_sample(data: torch.Tensor) -> torch.Tensor:
    """data: (B, C, ...) -> (B,) bool on data's device, True where the sample holds no NaN / inf (no sync)."""
    return torch.isfinite(data.detach().reshape(data.shape[0], -1)).all(dim=1)


#: where a batch came from, for the message (" in a training batch of epoch 3"), or a function that says it
Where = Union[str, Callable[[], str]]


def non_finite_input_message(finite: Sequence[bool], keys: Optional[Sequence[str]] = None, where: Where = "") -> str:
    """The error message naming the samples whose ``finite`` flag is False (by case key where given)."""
    where = where() if callable(where) else where
    bad = [i for i, ok in enumerate(finite) if not ok]
    if keys is not None and len(keys) == len(finite):
        cases = ", ".join(str(keys[i]) for i in bad)
    else:
        cases = "batch positions " + ", ".join(map(str, bad))
    return (f"input with NaN or inf values{where}: {cases}. Check these cases' images (and their "
            f"preprocessed files in nnUNet_preprocessed): training on them would give a NaN model.")


def check_finite_input(data: torch.Tensor, keys: Optional[Sequence[str]] = None, where: Where = "") -> None:
    """Raise a ``TrainingInputRuntimeError`` (a ``RuntimeError``) naming the cases (``keys``: ``batch['keys']``) if
    ``data`` (B, C, ...) holds NaN or inf; a function ``where`` is called only for the message."""
    finite = torch.isfinite(data.detach().reshape(data.shape[0], -1)).all(dim=1)  # as finite_per_sample
    if bool(finite.all()):
        return
    raise TrainingInputRuntimeError(non_finite_input_message(finite.tolist(), keys, where))
