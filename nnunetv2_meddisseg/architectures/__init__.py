"""Assembled networks (what nnU-Net plans name in ``network_class_name``)."""
from nnunetv2_meddisseg.architectures.meddisseg import MedDisSegNet, MedDisSegOutput

__all__ = ["MedDisSegNet", "MedDisSegOutput"]
