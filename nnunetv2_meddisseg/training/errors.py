"""The errors our trainers raise for a mistake in a run's input, never for a bug.

Each is a :class:`~nnunetv2_meddisseg.errors.UserError` and a ``ValueError``, and also a ``SystemExit`` whose
``code`` is the line ``<program>: error: <message>``. So where nothing catches one, Python prints that line
without a traceback and exits with status 1: nnU-Net's ``nnUNetv2_train`` prints
``nnUNetv2_train: error: <message>``, with no hook of ours in nnU-Net's process. Code that catches
``Exception``, ``ValueError`` or ``UserError`` catches them as any other error.
"""
import os
import sys

from nnunetv2_meddisseg.errors import UserError

__all__ = ["TrainingInputError", "TrainingInputRuntimeError"]


def _program_name() -> str:
    """The file name of ``sys.argv[0]`` (``nnUNetv2_train`` for nnU-Net's console command), else ``python``."""
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return os.path.basename(argv0.rstrip("/\\")) or "python"


class TrainingInputError(UserError, ValueError, SystemExit):
    """A mistake in a setting of a training run: an environment variable of this package, the recipe override
    file and its values, the configuration and plans, dataset.json, the encoder weights file the plans name."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        # what Python prints for an uncaught SystemExit, instead of a traceback
        self.code = f"{_program_name()}: error: {' '.join(str(message).split())}"


class TrainingInputRuntimeError(TrainingInputError, RuntimeError):
    """Input a run reads that it cannot use: the checkpoint ``--c`` resumes from, a batch with NaN or inf
    values, a network of the plans that the trainer cannot regularise."""
