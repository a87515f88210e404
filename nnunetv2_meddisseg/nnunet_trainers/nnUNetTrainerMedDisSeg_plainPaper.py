"""Exposes nnUNetTrainerMedDisSeg_plainPaper (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_plainPaper

__all__ = ["nnUNetTrainerMedDisSeg_plainPaper"]
