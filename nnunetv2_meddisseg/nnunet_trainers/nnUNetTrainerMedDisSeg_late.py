"""Exposes nnUNetTrainerMedDisSeg_late (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_late

__all__ = ["nnUNetTrainerMedDisSeg_late"]
