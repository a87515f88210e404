"""Exposes the Med-DisSeg trainer on the paper's schedule to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import nnUNetTrainerMedDisSeg_paper

__all__ = ["nnUNetTrainerMedDisSeg_paper"]
