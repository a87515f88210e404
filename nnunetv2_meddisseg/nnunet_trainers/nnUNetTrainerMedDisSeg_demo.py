"""Exposes the demo's short-schedule trainers to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.demo_trainers import (nnUNetTrainerBaseline_demo, nnUNetTrainerBaseline_smoke,
                                                       nnUNetTrainerMedDisSeg_demo)

__all__ = ["nnUNetTrainerBaseline_demo", "nnUNetTrainerMedDisSeg_demo", "nnUNetTrainerBaseline_smoke"]
