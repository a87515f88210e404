"""Exposes nnUNetTrainerMedDisSeg_paperSettings (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_paperSettings

__all__ = ["nnUNetTrainerMedDisSeg_paperSettings"]
