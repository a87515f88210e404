"""Exposes nnUNetTrainerDispersive (nnU-Net's network + dispersive loss) to nnU-Net's trainer search."""
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive, nnUNetTrainerDispersive_smoke

__all__ = ["nnUNetTrainerDispersive", "nnUNetTrainerDispersive_smoke"]
