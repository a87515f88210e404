"""Exposes nnUNetTrainerMedDisSeg_lambda0p2 (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_lambda0p2

__all__ = ["nnUNetTrainerMedDisSeg_lambda0p2"]
