"""Exposes nnUNetTrainerMedDisSeg_dispersiveStage2Only (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_dispersiveStage2Only

__all__ = ["nnUNetTrainerMedDisSeg_dispersiveStage2Only"]
