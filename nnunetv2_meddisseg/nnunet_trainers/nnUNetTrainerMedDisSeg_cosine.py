"""Exposes nnUNetTrainerMedDisSeg_cosine (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_cosine

__all__ = ["nnUNetTrainerMedDisSeg_cosine"]
