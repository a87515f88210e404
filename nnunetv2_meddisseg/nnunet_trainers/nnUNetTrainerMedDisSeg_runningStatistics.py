"""Exposes nnUNetTrainerMedDisSeg_runningStatistics (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_runningStatistics

__all__ = ["nnUNetTrainerMedDisSeg_runningStatistics"]
