"""Exposes nnUNetTrainerMedDisSeg_plainAdam (``training.scratch_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.scratch_variants import nnUNetTrainerMedDisSeg_plainAdam

__all__ = ["nnUNetTrainerMedDisSeg_plainAdam"]
