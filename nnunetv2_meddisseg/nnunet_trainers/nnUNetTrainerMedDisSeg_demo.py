"""Exposes nnUNetTrainerMedDisSeg_demo (a schedule of ``nnUNetv2_meddisseg_demo``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_demo import nnUNetTrainerMedDisSeg_demo

__all__ = ["nnUNetTrainerMedDisSeg_demo"]
