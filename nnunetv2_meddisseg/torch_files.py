"""Reading ``torch.save`` files that may come from someone else, without running code they carry.

A ``.pth`` file is a pickle that can run any function when loaded with ``weights_only=False``. The package loads
with ``weights_only=True``, allowing besides tensors and containers only the NumPy scalars nnU-Net logs (for that
load only); anything else raises ``UnsafeTorchFile``, which never advises ``weights_only=False``. nnU-Net's
predictor loads with ``weights_only=False``, so ``initialize_predictor`` hands it a private, weights-only copy.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from nnunetv2_meddisseg.environment import use_our_trainers
from nnunetv2_meddisseg.errors import UserError

__all__ = ["NUMPY_SCALAR_GLOBALS", "PREDICTOR_KEYS", "UnsafeTorchFile", "is_torch_file", "load_weights_only",
           "refusal_reason", "read_checkpoint", "check_model_folder_checkpoints", "initialize_predictor"]


def _numpy_scalar_globals() -> List[Any]:
    multiarray = getattr(np, "_core", None) or np.core
    kinds = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64]
    return [multiarray.multiarray.scalar, np.dtype, *(type(np.dtype(k)) for k in kinds)]


#: what a numpy scalar (``np.float64`` of ``np.mean``, as nnU-Net logs) needs to be unpickled
NUMPY_SCALAR_GLOBALS = _numpy_scalar_globals()


class UnsafeTorchFile(UserError, ValueError):
    """A ``torch.save`` file holding objects other than tensors, containers, numbers and NumPy scalars."""


def is_torch_file(path: str) -> bool:
    """True where ``path`` starts like a file ``torch.save`` writes (a zip archive, or the legacy pickle)."""
    with open(path, "rb") as f:
        is_pickle = f.read(1) == b"\x80"
    return is_pickle or zipfile.is_zipfile(path)


def refusal_reason(error: BaseException) -> str:
    """What torch's ``weights_only`` refusal says the file asked for, ``needs GLOBAL <name>``, without its advice."""
    found = re.search(r"GLOBAL\s+([\w.]+)", str(error)) or re.search(r"got <class '([^']+)'>", str(error))
    return f"needs GLOBAL {found.group(1)}" if found else "needs a Python object that is no tensor"


def load_weights_only(path: str, what: str = "file", mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU with ``NUMPY_SCALAR_GLOBALS`` allowed (``mmap``: zip format
    only). Raises ``UnsafeTorchFile`` naming ``what`` and ``path`` for anything else; other read errors propagate."""
    path = os.fspath(path)
    with torch.serialization.safe_globals(NUMPY_SCALAR_GLOBALS):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap or None)
        except pickle.UnpicklingError as e:
            if "Weights only load failed" not in str(e):  # a broken file, not torch's refusal
                raise
            raise UnsafeTorchFile(f"{what} {path} holds pickled objects other than tensors, numbers and containers "
                                  f"({refusal_reason(e)}); it was not loaded, since loading such objects can run "
                                  f"code: save plain data (state_dict() and built-in types) instead") from None


#: what nnU-Net's predictor reads from every checkpoint it loads
PREDICTOR_KEYS = ("network_weights", "trainer_name", "init_args")
#: what it reads where a checkpoint has it
_MIRRORING = "inference_allowed_mirroring_axes"


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:200]}".rstrip(": ")


def read_checkpoint(path: Union[str, os.PathLike], mmap: Optional[bool] = None) -> Mapping[str, Any]:
    """A checkpoint read by ``load_weights_only`` (memory-mapped by default for torch.save's zip format). Raises a
    one-line ``UserError`` naming the file where it is missing, unreadable, empty, truncated or corrupt or holds no
    dict, and ``UnsafeTorchFile`` where it holds other objects."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise UserError(f"no trained model: {path} does not exist")
    if os.path.getsize(path) == 0:
        raise UserError(f"{path} is empty (0 bytes): an interrupted copy or save? copy it again or train the model "
                        f"again")
    try:
        torch_file = is_torch_file(path)
    except OSError as e:
        raise UserError(f"{path} cannot be read: {e.strerror or e}") from None
    if not torch_file:
        raise UserError(f"{path} cannot be read as a checkpoint (truncated or corrupt? it is no complete file written "
                        f"by torch.save)")
    try:
        loaded = load_weights_only(path, "checkpoint", mmap=zipfile.is_zipfile(path) if mmap is None else mmap)
    except UnsafeTorchFile:
        raise
    except Exception as e:  # noqa: BLE001 - a truncated or corrupt file is the user's file
        raise UserError(f"{path} cannot be read as a checkpoint (truncated or corrupt? {_one_line(e)})") from None
    if not isinstance(loaded, Mapping):
        raise UserError(f"{path} is not an nnU-Net checkpoint: it holds a {type(loaded).__name__}, not a dict")
    return loaded


def _folds(folds: Iterable[Union[int, str]]) -> Tuple[Union[int, str], ...]:
    """``folds`` as nnU-Net's predictor takes them: numbers, or ``'all'``."""
    try:
        return tuple(f if f == "all" else int(f) for f in folds)
    except ValueError:
        raise UserError(f"folds {' '.join(map(str, folds))}: expected fold numbers or 'all'") from None


def _predictor_checkpoint(path: Path) -> Mapping[str, Any]:
    checkpoint = read_checkpoint(path)
    missing = [k for k in PREDICTOR_KEYS if k not in checkpoint]
    if missing:
        raise UserError(f"{path} is not an nnU-Net checkpoint: it has no {', '.join(missing)}")
    return checkpoint


def check_model_folder_checkpoints(model_folder: Union[str, os.PathLike], folds: Sequence[Union[int, str]],
                                   checkpoint_name: str = "checkpoint_final.pth") -> List[Path]:
    """Read each fold's ``model_folder/fold_<f>/<checkpoint_name>`` with ``read_checkpoint`` and check that it holds
    ``PREDICTOR_KEYS``; returns the files. Raises for the first file that fails."""
    files = [Path(model_folder) / f"fold_{fold}" / checkpoint_name for fold in _folds(folds)]
    for path in files:
        _predictor_checkpoint(path)
    return files


def initialize_predictor(predictor: Any, model_folder: Union[str, os.PathLike], folds: Sequence[Union[int, str]],
                         checkpoint_name: str = "checkpoint_final.pth") -> None:
    """``predictor.initialize_from_trained_model_folder(model_folder, folds, checkpoint_name)`` without running code
    a checkpoint carries: the predictor loads a private copy of what it reads, checked as
    ``check_model_folder_checkpoints`` does. An unknown trainer class is a one-line ``UserError``."""
    folds = _folds(folds)
    files = [Path(model_folder) / f"fold_{fold}" / checkpoint_name for fold in folds]
    use_our_trainers()
    trainer = None
    with tempfile.TemporaryDirectory() as copy:
        for fold, path in zip(folds, files):
            checkpoint = _predictor_checkpoint(path)
            trainer = trainer or checkpoint["trainer_name"]  # nnU-Net takes the first fold's
            (Path(copy) / f"fold_{fold}").mkdir()
            torch.save({k: checkpoint[k] for k in (*PREDICTOR_KEYS, _MIRRORING) if k in checkpoint},
                       Path(copy) / f"fold_{fold}" / checkpoint_name)
        for name in ("plans.json", "dataset.json"):
            shutil.copyfile(Path(model_folder) / name, Path(copy) / name)
        try:
            predictor.initialize_from_trained_model_folder(copy, folds, checkpoint_name)
        except RuntimeError as e:
            if not str(e).startswith("Could not find requested nnunet trainer"):
                raise
            raise UserError(f"{files[0]}: its trainer class {trainer} is neither nnU-Net's nor this package's: add "
                            f"the folder of the module that defines it to nnUNet_extTrainer") from None
