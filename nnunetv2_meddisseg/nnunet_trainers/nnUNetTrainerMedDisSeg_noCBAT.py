"""Exposes nnUNetTrainerMedDisSeg_noCBAT (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_noCBAT

__all__ = ["nnUNetTrainerMedDisSeg_noCBAT"]
