"""Exposes nnUNetTrainerMedDisSeg_middle (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_middle

__all__ = ["nnUNetTrainerMedDisSeg_middle"]
