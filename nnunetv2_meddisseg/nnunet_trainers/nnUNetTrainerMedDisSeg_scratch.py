"""Exposes the from-scratch recipe variants to nnU-Net's trainer search (nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.scratch_variants import (nnUNetTrainerDispersive_cosine,
                                                          nnUNetTrainerMedDisSeg_paperSettings,
                                                          nnUNetTrainerMedDisSeg_plainAdam,
                                                          nnUNetTrainerMedDisSeg_plainPaper,
                                                          nnUNetTrainerMedDisSeg_plainSGD,
                                                          nnUNetTrainerMedDisSeg_scratchAdam,
                                                          nnUNetTrainerMedDisSeg_scratchSGD)

__all__ = ["nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
           "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD", "nnUNetTrainerMedDisSeg_plainAdam",
           "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerDispersive_cosine"]
