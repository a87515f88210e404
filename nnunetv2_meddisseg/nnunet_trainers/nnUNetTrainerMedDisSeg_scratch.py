"""Exposes the from-scratch recipe variants and the dispersive-form variants of the study
(nnUNetTrainerDispersive with the paper's InfoNCE-L2 or the uncentred cosine, Med-DisSeg with the
batch-centred cosine) and the BatchNorm statistics study's variants to nnU-Net's trainer search
(nnUNet_extTrainer)."""
from nnunetv2_meddisseg.training.scratch_variants import (nnUNetTrainerDispersive_cosine,
                                                          nnUNetTrainerDispersive_infonceL2,
                                                          nnUNetTrainerMedDisSeg_cosineCentred,
                                                          nnUNetTrainerMedDisSeg_paperSettings,
                                                          nnUNetTrainerMedDisSeg_plainAdam,
                                                          nnUNetTrainerMedDisSeg_plainPaper,
                                                          nnUNetTrainerMedDisSeg_plainPaperRunningStatistics,
                                                          nnUNetTrainerMedDisSeg_runningStatistics,
                                                          nnUNetTrainerMedDisSeg_plainSGD,
                                                          nnUNetTrainerMedDisSeg_scratchAdam,
                                                          nnUNetTrainerMedDisSeg_scratchSGD,
                                                          nnUNetTrainerMedDisSeg_scratchSGDCentred)

__all__ = ["nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
           "nnUNetTrainerMedDisSeg_scratchSGDCentred",
           "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD", "nnUNetTrainerMedDisSeg_plainAdam",
           "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
           "nnUNetTrainerDispersive_infonceL2", "nnUNetTrainerDispersive_cosine",
           "nnUNetTrainerMedDisSeg_runningStatistics", "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics"]
