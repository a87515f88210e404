"""Exposes nnUNetTrainerMedDisSeg_late (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_late

__all__ = ["nnUNetTrainerMedDisSeg_late"]
