"""Exposes nnUNetTrainerMedDisSeg_paperSettings (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_paperSettings

__all__ = ["nnUNetTrainerMedDisSeg_paperSettings"]
