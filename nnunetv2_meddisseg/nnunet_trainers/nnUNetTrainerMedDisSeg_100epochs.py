"""Exposes nnUNetTrainerMedDisSeg_100epochs (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_100epochs

__all__ = ["nnUNetTrainerMedDisSeg_100epochs"]
