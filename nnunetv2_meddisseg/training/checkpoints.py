"""Checkpoint files: writing them atomically (a temporary file in the same folder, then ``os.replace``), so
that a kill during a save never leaves a truncated ``checkpoint_latest.pth``, and reading the checkpoint a
run resumes from with an error that names the file and what to do."""
import glob
import os
import zipfile
from typing import Mapping

import torch

__all__ = ["atomic_torch_save", "read_checkpoint_for_resuming"]


def atomic_torch_save(obj: object, filename: str) -> None:
    """``torch.save(obj, filename)`` that never leaves a partial ``filename`` behind.

    The object is written to ``<filename>.<pid>.tmp`` in the same folder, flushed to disk and moved
    over ``filename`` with ``os.replace`` (atomic on POSIX and Windows). Leftover temporary files of
    earlier, killed saves of the same ``filename`` are removed first.
    """
    filename = os.path.abspath(filename)
    for stale in glob.glob(glob.escape(filename) + ".*.tmp"):
        try:
            os.remove(stale)
        except OSError:
            pass
    temporary = f"{filename}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, filename)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def read_checkpoint_for_resuming(filename: str) -> Mapping[str, object]:
    """The checkpoint ``load_checkpoint`` resumes from (``torch_files.load_weights_only``, memory-mapped); a
    :class:`~nnunetv2_meddisseg.training.errors.TrainingInputRuntimeError` (a ``RuntimeError``) naming the
    file (and ``checkpoint_best.pth`` beside it, where there is one) if it cannot be read."""
    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile, load_weights_only
    from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

    try:
        return load_weights_only(filename, "checkpoint", mmap=zipfile.is_zipfile(filename))
    except UnsafeTorchFile:
        raise
    except Exception as error:  # noqa: BLE001 - truncated, empty or not a torch file
        best = os.path.join(os.path.dirname(os.path.abspath(filename)), "checkpoint_best.pth")
        fallback = (f"copy {best} over it to resume from the best epoch, or " if os.path.isfile(best)
                    and os.path.abspath(filename) != best else "")
        raise TrainingInputRuntimeError(f"cannot read the checkpoint {filename} (truncated or corrupt? "
                                        f"{type(error).__name__}: {' '.join(str(error).split())[:200]}): {fallback}"
                                        f"train again without --c") from None

