"""Exposes nnUNetTrainerMedDisSeg_tau0p1 (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_tau0p1

__all__ = ["nnUNetTrainerMedDisSeg_tau0p1"]
