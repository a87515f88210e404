"""Exposes nnUNetTrainerMedDisSeg_demo (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_demo

__all__ = ["nnUNetTrainerMedDisSeg_demo"]
