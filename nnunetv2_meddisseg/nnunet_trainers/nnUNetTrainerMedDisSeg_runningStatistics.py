"""Exposes nnUNetTrainerMedDisSeg_runningStatistics (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_runningStatistics

__all__ = ["nnUNetTrainerMedDisSeg_runningStatistics"]
