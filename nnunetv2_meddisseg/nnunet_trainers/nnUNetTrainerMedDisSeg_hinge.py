"""Exposes nnUNetTrainerMedDisSeg_hinge (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_hinge

__all__ = ["nnUNetTrainerMedDisSeg_hinge"]
