"""Exposes nnUNetTrainerMedDisSeg_plainSGD (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_plainSGD

__all__ = ["nnUNetTrainerMedDisSeg_plainSGD"]
