"""Exposes nnUNetTrainerDispersive_cosine (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerDispersive_cosine

__all__ = ["nnUNetTrainerDispersive_cosine"]
