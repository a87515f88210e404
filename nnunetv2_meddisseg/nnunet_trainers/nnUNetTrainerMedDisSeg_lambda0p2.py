"""Exposes nnUNetTrainerMedDisSeg_lambda0p2 (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_lambda0p2

__all__ = ["nnUNetTrainerMedDisSeg_lambda0p2"]
