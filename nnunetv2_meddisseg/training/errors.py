"""The errors our trainers raise for a mistake in a run's input, never for a bug.

Under nnU-Net's commands (``nnUNetv2_train``, ``nnUNetv2_predict``) they end the run with one line on stderr,
``nnUNetv2_train: error: <message>``, and no traceback (:func:`nnunetv2_meddisseg.cli.install_excepthook`,
installed when nnU-Net's trainer search imports our trainers). In a process of one's own they are ordinary
exceptions. Each class is also the built-in exception these errors were before, so that code catching that
keeps working: :class:`TrainingInputError` a ``ValueError``, :class:`TrainingInputRuntimeError` also a
``RuntimeError``, :class:`TrainingInputFileNotFoundError` also a ``FileNotFoundError``.
"""
from nnunetv2_meddisseg.errors import UserError

__all__ = ["TrainingInputError", "TrainingInputRuntimeError", "TrainingInputFileNotFoundError"]


class TrainingInputError(UserError, ValueError):
    """A mistake in a setting of a training run: an environment variable of this package, the recipe override
    file and its values, the configuration and plans, dataset.json, the encoder weights file the plans name."""


class TrainingInputRuntimeError(TrainingInputError, RuntimeError):
    """Input a run reads that it cannot use: the checkpoint ``--c`` resumes from, a batch with NaN or inf
    values, a network of the plans that the trainer cannot regularise."""


class TrainingInputFileNotFoundError(TrainingInputError, FileNotFoundError):
    """A file the plans name that does not exist (the encoder weights)."""
