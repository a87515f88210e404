"""Exposes the from-scratch recipe variants (and nnUNetTrainerDispersive with the paper's InfoNCE-L2) to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.scratch_variants import (nnUNetTrainerDispersive_infonceL2,
                                                          nnUNetTrainerMedDisSeg_paperSettings,
                                                          nnUNetTrainerMedDisSeg_plainAdam,
                                                          nnUNetTrainerMedDisSeg_plainPaper,
                                                          nnUNetTrainerMedDisSeg_plainSGD,
                                                          nnUNetTrainerMedDisSeg_scratchAdam,
                                                          nnUNetTrainerMedDisSeg_scratchSGD)

__all__ = ["nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
           "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD", "nnUNetTrainerMedDisSeg_plainAdam",
           "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerDispersive_infonceL2"]
