"""Exposes nnUNetTrainerMedDisSeg_smoke (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_smoke

__all__ = ["nnUNetTrainerMedDisSeg_smoke"]
