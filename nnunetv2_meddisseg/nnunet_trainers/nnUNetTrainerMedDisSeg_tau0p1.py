"""Exposes nnUNetTrainerMedDisSeg_tau0p1 (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_tau0p1

__all__ = ["nnUNetTrainerMedDisSeg_tau0p1"]
