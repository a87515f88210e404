"""Exposes nnUNetTrainerMedDisSeg_plainPaperRunningStatistics (``training.scratch_variants``) to nnU-Net's
trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_plainPaperRunningStatistics

__all__ = ["nnUNetTrainerMedDisSeg_plainPaperRunningStatistics"]
