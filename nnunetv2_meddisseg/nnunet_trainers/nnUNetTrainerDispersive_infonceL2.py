"""Exposes nnUNetTrainerDispersive_infonceL2 (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerDispersive_infonceL2

__all__ = ["nnUNetTrainerDispersive_infonceL2"]
