"""Exposes nnUNetTrainerDispersive (``training.nnUNetTrainerDispersive``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive

__all__ = ["nnUNetTrainerDispersive"]
