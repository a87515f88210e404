"""The errors our trainers raise for a mistake in a run's input, never for a bug.

Each is a ``UserError``, a ``ValueError`` and a ``SystemExit`` whose ``code`` is ``<program>: error: <message>``:
uncaught, Python prints that line without a traceback and exits with status 1 (``nnUNetv2_train: error: ...``),
with no hook of ours in nnU-Net's process. ``except Exception`` / ``ValueError`` / ``UserError`` catch them as usual.
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
    """A mistake in a run's settings: environment variables, recipe overrides, plans, dataset.json, encoder weights."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        # what Python prints for an uncaught SystemExit, instead of a traceback
        self.code = f"{_program_name()}: error: {' '.join(str(message).split())}"


class TrainingInputRuntimeError(TrainingInputError, RuntimeError):
    """Input a run cannot use: the ``--c`` checkpoint, a batch with NaN / inf, a plans network it cannot regularise."""
