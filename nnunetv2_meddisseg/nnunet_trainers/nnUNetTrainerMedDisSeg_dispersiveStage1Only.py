"""Exposes nnUNetTrainerMedDisSeg_dispersiveStage1Only (``training.variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_dispersiveStage1Only

__all__ = ["nnUNetTrainerMedDisSeg_dispersiveStage1Only"]
