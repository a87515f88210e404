"""Exposes nnUNetTrainerMedDisSeg_plainAdam (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_plainAdam

__all__ = ["nnUNetTrainerMedDisSeg_plainAdam"]
