"""Exposes nnUNetTrainerMedDisSeg_scratchSGDCentred (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_scratchSGDCentred

__all__ = ["nnUNetTrainerMedDisSeg_scratchSGDCentred"]
