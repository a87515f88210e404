"""Exposes nnUNetTrainerMedDisSeg_cosineCentred (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_cosineCentred

__all__ = ["nnUNetTrainerMedDisSeg_cosineCentred"]
