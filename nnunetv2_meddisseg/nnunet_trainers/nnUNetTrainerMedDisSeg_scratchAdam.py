"""Exposes nnUNetTrainerMedDisSeg_scratchAdam (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_scratchAdam

__all__ = ["nnUNetTrainerMedDisSeg_scratchAdam"]
