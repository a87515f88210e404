"""Exposes nnUNetTrainerMedDisSeg_plainSGD (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_plainSGD

__all__ = ["nnUNetTrainerMedDisSeg_plainSGD"]
