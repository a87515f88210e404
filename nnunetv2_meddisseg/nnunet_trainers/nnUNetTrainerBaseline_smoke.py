"""Exposes nnUNetTrainerBaseline_smoke (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerBaseline_smoke

__all__ = ["nnUNetTrainerBaseline_smoke"]
