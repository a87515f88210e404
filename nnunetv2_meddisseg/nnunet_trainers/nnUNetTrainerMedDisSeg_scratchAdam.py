"""Exposes nnUNetTrainerMedDisSeg_scratchAdam (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_scratchAdam

__all__ = ["nnUNetTrainerMedDisSeg_scratchAdam"]
