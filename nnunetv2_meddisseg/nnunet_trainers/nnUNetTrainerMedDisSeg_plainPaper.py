"""Exposes nnUNetTrainerMedDisSeg_plainPaper (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_plainPaper

__all__ = ["nnUNetTrainerMedDisSeg_plainPaper"]
