"""Exposes nnUNetTrainerMedDisSeg_lambda1p0 (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_lambda1p0

__all__ = ["nnUNetTrainerMedDisSeg_lambda1p0"]
