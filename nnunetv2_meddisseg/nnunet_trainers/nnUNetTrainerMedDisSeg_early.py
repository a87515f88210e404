"""Exposes nnUNetTrainerMedDisSeg_early (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_early

__all__ = ["nnUNetTrainerMedDisSeg_early"]
