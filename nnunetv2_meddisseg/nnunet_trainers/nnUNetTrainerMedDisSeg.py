"""Exposes nnUNetTrainerMedDisSeg (``training.nnUNetTrainerMedDisSeg``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

__all__ = ["nnUNetTrainerMedDisSeg"]
