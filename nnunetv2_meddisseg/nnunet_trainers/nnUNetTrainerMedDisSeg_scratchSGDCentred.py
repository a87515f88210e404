"""Exposes nnUNetTrainerMedDisSeg_scratchSGDCentred (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_scratchSGDCentred

__all__ = ["nnUNetTrainerMedDisSeg_scratchSGDCentred"]
