"""Exposes nnUNetTrainerDispersive_cosine (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerDispersive_cosine

__all__ = ["nnUNetTrainerDispersive_cosine"]
