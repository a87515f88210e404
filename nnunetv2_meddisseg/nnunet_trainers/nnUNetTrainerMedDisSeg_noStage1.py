"""Exposes nnUNetTrainerMedDisSeg_noStage1 (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_noStage1

__all__ = ["nnUNetTrainerMedDisSeg_noStage1"]
