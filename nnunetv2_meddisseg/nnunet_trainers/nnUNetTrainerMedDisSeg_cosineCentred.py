"""Exposes nnUNetTrainerMedDisSeg_cosineCentred (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_cosineCentred

__all__ = ["nnUNetTrainerMedDisSeg_cosineCentred"]
