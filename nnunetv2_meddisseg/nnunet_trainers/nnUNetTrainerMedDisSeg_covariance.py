"""Exposes nnUNetTrainerMedDisSeg_covariance (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_covariance

__all__ = ["nnUNetTrainerMedDisSeg_covariance"]
