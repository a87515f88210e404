"""Exposes nnUNetTrainerMedDisSeg_cosine (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_cosine

__all__ = ["nnUNetTrainerMedDisSeg_cosine"]
