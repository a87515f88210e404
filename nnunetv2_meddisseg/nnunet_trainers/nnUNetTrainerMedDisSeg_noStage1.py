"""Exposes nnUNetTrainerMedDisSeg_noStage1 (``training.ablation_variants``) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.ablation_variants import nnUNetTrainerMedDisSeg_noStage1

__all__ = ["nnUNetTrainerMedDisSeg_noStage1"]
