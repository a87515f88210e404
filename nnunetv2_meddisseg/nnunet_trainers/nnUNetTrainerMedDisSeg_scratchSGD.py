"""Exposes nnUNetTrainerMedDisSeg_scratchSGD (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_scratchSGD

__all__ = ["nnUNetTrainerMedDisSeg_scratchSGD"]
