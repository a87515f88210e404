"""Exposes nnUNetTrainerMedDisSeg_noDispersive (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_noDispersive

__all__ = ["nnUNetTrainerMedDisSeg_noDispersive"]
