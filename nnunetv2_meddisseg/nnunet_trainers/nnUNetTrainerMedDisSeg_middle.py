"""Exposes nnUNetTrainerMedDisSeg_middle (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_middle

__all__ = ["nnUNetTrainerMedDisSeg_middle"]
