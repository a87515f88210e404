"""Exposes nnUNetTrainerMedDisSeg_scratchSGD (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_scratchSGD

__all__ = ["nnUNetTrainerMedDisSeg_scratchSGD"]
