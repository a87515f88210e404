"""Exposes nnUNetTrainerMedDisSeg_covariance (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_covariance

__all__ = ["nnUNetTrainerMedDisSeg_covariance"]
