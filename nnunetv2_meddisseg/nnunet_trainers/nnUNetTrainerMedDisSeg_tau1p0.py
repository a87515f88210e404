"""Exposes nnUNetTrainerMedDisSeg_tau1p0 (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_tau1p0

__all__ = ["nnUNetTrainerMedDisSeg_tau1p0"]
