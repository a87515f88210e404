"""Exposes nnUNetTrainerMedDisSeg_dispersiveStage1Only (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_dispersiveStage1Only

__all__ = ["nnUNetTrainerMedDisSeg_dispersiveStage1Only"]
