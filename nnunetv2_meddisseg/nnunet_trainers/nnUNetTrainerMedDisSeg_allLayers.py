"""Exposes nnUNetTrainerMedDisSeg_allLayers (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_allLayers

__all__ = ["nnUNetTrainerMedDisSeg_allLayers"]
