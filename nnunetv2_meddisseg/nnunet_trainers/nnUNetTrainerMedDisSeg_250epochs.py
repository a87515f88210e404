"""Exposes nnUNetTrainerMedDisSeg_250epochs (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_250epochs

__all__ = ["nnUNetTrainerMedDisSeg_250epochs"]
