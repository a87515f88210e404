"""Exposes nnUNetTrainerMedDisSeg_paper (``training.nnUNetTrainerMedDisSeg_paper``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import nnUNetTrainerMedDisSeg_paper

__all__ = ["nnUNetTrainerMedDisSeg_paper"]
