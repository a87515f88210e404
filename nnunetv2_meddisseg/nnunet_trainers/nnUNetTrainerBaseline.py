"""Exposes nnUNetTrainerBaseline (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerBaseline

__all__ = ["nnUNetTrainerBaseline"]
