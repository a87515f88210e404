"""Reading ``torch.save`` files that may come from someone else, without running code they carry.

A ``.pth`` file is a pickle: loaded with ``weights_only=False`` it can run any function its author
chose. Every file this package reads with ``torch.load`` is read with ``weights_only=True``; a
checkpoint may hold, besides tensors and containers, the NumPy scalars nnU-Net logs
(:data:`NUMPY_SCALAR_GLOBALS`, allowed for the duration of one load only). A file needing anything
else is refused with :class:`UnsafeTorchFile`, whose message says what the file asked for and never
advises ``weights_only=False``.
"""
from __future__ import annotations

import os
import pickle
import re
import zipfile
from typing import Any, List

import numpy as np
import torch

from nnunetv2_meddisseg.cli import UserError

__all__ = ["NUMPY_SCALAR_GLOBALS", "UnsafeTorchFile", "is_torch_file", "load_weights_only", "refusal_reason"]


def _numpy_scalar_globals() -> List[Any]:
    multiarray = getattr(np, "_core", None) or np.core
    kinds = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64]
    return [multiarray.multiarray.scalar, np.dtype, *(type(np.dtype(k)) for k in kinds)]


#: what a numpy scalar (``np.float64`` of ``np.mean``, as nnU-Net logs) needs to be unpickled
NUMPY_SCALAR_GLOBALS = _numpy_scalar_globals()


class UnsafeTorchFile(UserError, ValueError):
    """A ``torch.save`` file that holds objects other than tensors, containers, numbers and NumPy scalars (the
    user's file: a :class:`~nnunetv2_meddisseg.cli.UserError`, reported without a traceback)."""


def is_torch_file(path: str) -> bool:
    """True where ``path`` starts like a file ``torch.save`` writes (a zip archive, or the legacy pickle)."""
    with open(path, "rb") as f:
        is_pickle = f.read(1) == b"\x80"
    return is_pickle or zipfile.is_zipfile(path)


def refusal_reason(error: BaseException) -> str:
    """What torch's ``weights_only`` refusal says the file asked for: ``needs GLOBAL <name>`` (one line,
    without torch's advice)."""
    found = re.search(r"GLOBAL\s+([\w.]+)", str(error)) or re.search(r"got <class '([^']+)'>", str(error))
    return f"needs GLOBAL {found.group(1)}" if found else "needs a Python object that is no tensor"


def load_weights_only(path: str, what: str = "file", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU with :data:`NUMPY_SCALAR_GLOBALS` allowed
    (``mmap``: tensors are read when used; for files in torch.save's default zip format).

    Raises :class:`UnsafeTorchFile` (naming ``what`` and ``path``) where the file holds anything else;
    other read errors (a truncated or empty file, not a torch file) propagate as torch raises them."""
    path = os.fspath(path)
    with torch.serialization.safe_globals(NUMPY_SCALAR_GLOBALS):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap or None)
        except pickle.UnpicklingError as e:
            if "Weights only load failed" not in str(e):
                raise
            raise UnsafeTorchFile(
                f"{what} {path} holds pickled objects other than tensors, numbers and containers "
                f"({refusal_reason(e)}); it was not loaded, since loading such objects can run code: save plain "
                f"data (state_dict() and built-in types) instead") from None
