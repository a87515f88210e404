"""Exposes nnUNetTrainerMedDisSeg_tau0p8 (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_tau0p8

__all__ = ["nnUNetTrainerMedDisSeg_tau0p8"]
