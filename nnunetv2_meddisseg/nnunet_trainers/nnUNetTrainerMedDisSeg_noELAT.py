"""Exposes nnUNetTrainerMedDisSeg_noELAT (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_noELAT

__all__ = ["nnUNetTrainerMedDisSeg_noELAT"]
