"""Exposes nnUNetTrainerMedDisSeg_ReLU (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_ReLU

__all__ = ["nnUNetTrainerMedDisSeg_ReLU"]
