"""Exposes nnUNetTrainerBaseline_demo (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerBaseline_demo

__all__ = ["nnUNetTrainerBaseline_demo"]
