"""Exposes nnUNetTrainerDispersive_smoke (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerDispersive_smoke

__all__ = ["nnUNetTrainerDispersive_smoke"]
