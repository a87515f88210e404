"""Exposes nnUNetTrainerMedDisSeg_plainPaperRunningStatistics (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_plainPaperRunningStatistics

__all__ = ["nnUNetTrainerMedDisSeg_plainPaperRunningStatistics"]
