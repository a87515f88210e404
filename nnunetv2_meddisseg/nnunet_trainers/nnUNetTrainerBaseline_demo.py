"""Exposes nnUNetTrainerBaseline_demo (a schedule of ``nnUNetv2_meddisseg_demo``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerBaseline_demo import nnUNetTrainerBaseline_demo

__all__ = ["nnUNetTrainerBaseline_demo"]
