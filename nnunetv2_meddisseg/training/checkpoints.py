"""Checkpoint files: written whole, so a kill during a save never truncates ``checkpoint_latest.pth``, and read for
resuming with an error that names the file and what to do."""
import os
import zipfile
from pathlib import Path
from typing import Mapping

import torch

from nnunetv2_meddisseg.files import write_atomically
from nnunetv2_meddisseg.torch_files import UnsafeTorchFile, load_weights_only
from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

__all__ = ["save_checkpoint_file", "read_checkpoint_for_resuming"]


def save_checkpoint_file(checkpoint: Mapping[str, object], filename: str) -> None:
    """``torch.save`` to a file beside ``filename``, flushed to disk and renamed over it: a kill during a save leaves
    the previous checkpoint."""
    def write(partial: Path) -> None:
        with open(partial, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())

    write_atomically(Path(filename), write)


def read_checkpoint_for_resuming(filename: str) -> Mapping[str, object]:
    """The checkpoint to resume from, weights-only and memory-mapped; a ``TrainingInputRuntimeError`` naming the file
    (and ``checkpoint_best.pth`` beside it, if any) where it cannot be read or carries code."""
    try:
        return load_weights_only(filename, "checkpoint", mmap=zipfile.is_zipfile(filename))
    except UnsafeTorchFile as error:
        raise TrainingInputRuntimeError(str(error)) from None
    except Exception as error:  # noqa: BLE001 - truncated, empty or not a torch file
        best = os.path.join(os.path.dirname(os.path.abspath(filename)), "checkpoint_best.pth")
        fallback = (f"copy {best} over it to resume from the best epoch, or " if os.path.isfile(best)
                    and os.path.abspath(filename) != best else "")
        raise TrainingInputRuntimeError(f"cannot read the checkpoint {filename} (truncated or corrupt? "
                                        f"{type(error).__name__}: {' '.join(str(error).split())[:200]}): {fallback}"
                                        f"train again without --c") from None

