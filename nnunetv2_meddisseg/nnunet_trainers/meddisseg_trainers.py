"""Every trainer of this package, for nnU-Net's search by class name (``-tr NAME``).

nnU-Net imports this file as a top-level module and then drops it, so it only imports the package's classes.
"""
from nnunetv2_meddisseg.ablation.study_trainers import *  # noqa: F401,F403  the arms of finished studies
from nnunetv2_meddisseg.ablation.study_trainers import __all__ as _study
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import nnUNetTrainerMedDisSeg_paper
from nnunetv2_meddisseg.training.variants import *  # noqa: F401,F403  one line each
from nnunetv2_meddisseg.training.variants import __all__ as _variants

#: the catalogue's order: the method, its variants, nnU-Net's network with the dispersive loss, baselines, studies
__all__ = ["nnUNetTrainerMedDisSeg", "nnUNetTrainerMedDisSeg_paper",
           *[name for name in _variants if name.startswith("nnUNetTrainerMedDisSeg_")], "nnUNetTrainerDispersive",
           *[name for name in _variants if not name.startswith("nnUNetTrainerMedDisSeg_")], *_study]
