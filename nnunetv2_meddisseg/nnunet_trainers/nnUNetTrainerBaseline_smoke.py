"""Exposes nnUNetTrainerBaseline_smoke (a schedule of ``nnUNetv2_meddisseg_demo``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerBaseline_smoke import nnUNetTrainerBaseline_smoke

__all__ = ["nnUNetTrainerBaseline_smoke"]
