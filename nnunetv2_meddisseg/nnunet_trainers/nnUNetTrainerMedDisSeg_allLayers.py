"""Exposes nnUNetTrainerMedDisSeg_allLayers (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_allLayers

__all__ = ["nnUNetTrainerMedDisSeg_allLayers"]
