"""Exposes the Med-DisSeg ablation variants to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.ablation_variants import *  # noqa: F401,F403
from nnunetv2_meddisseg.training.ablation_variants import __all__ as _ablations

__all__ = [name for name in _ablations if name.startswith("nnUNetTrainer")]
