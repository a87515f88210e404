"""Exposes the Med-DisSeg trainer and its variants to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.variants import (nnUNetTrainerMedDisSeg_100epochs, nnUNetTrainerMedDisSeg_250epochs,
                                                  nnUNetTrainerMedDisSeg_noDispersive, nnUNetTrainerMedDisSeg_smoke)

__all__ = ["nnUNetTrainerMedDisSeg", "nnUNetTrainerMedDisSeg_smoke", "nnUNetTrainerMedDisSeg_250epochs",
           "nnUNetTrainerMedDisSeg_100epochs", "nnUNetTrainerMedDisSeg_noDispersive"]
