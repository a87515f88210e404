"""Exposes nnUNetTrainerMedDisSeg_hinge (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_hinge

__all__ = ["nnUNetTrainerMedDisSeg_hinge"]
