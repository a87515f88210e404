"""Exposes the demo's two short-schedule trainers to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.demo_trainers import nnUNetTrainerBaseline_demo, nnUNetTrainerMedDisSeg_demo

__all__ = ["nnUNetTrainerBaseline_demo", "nnUNetTrainerMedDisSeg_demo"]
