"""The arms of finished studies, one line each; kept so that their models still predict by name.

The from-scratch (``benchmarks/quality.py``) and BatchNorm statistics studies; found via ``nnUNet_extTrainer``.
"""
from dataclasses import replace

from nnunetv2_meddisseg.training.variants import (
    MEDDISSEG,
    PLAIN_TRAINING,
    SCRATCH_ADAM,
    SCRATCH_SGD,
    SCRATCH_SGD_CENTRED,
    nnUNetTrainerMedDisSeg,
)

__all__ = [
    "nnUNetTrainerMedDisSeg_scratchSGD",
    "nnUNetTrainerMedDisSeg_scratchSGDCentred", "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD",
    "nnUNetTrainerMedDisSeg_plainAdam", "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
    "nnUNetTrainerMedDisSeg_runningStatistics", "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics",
]


class nnUNetTrainerMedDisSeg_scratchSGD(nnUNetTrainerMedDisSeg):
    """from-scratch study: SGD 1e-2 for every group, cosine dispersive loss"""
    recipe = replace(MEDDISSEG, **SCRATCH_SGD)


class nnUNetTrainerMedDisSeg_scratchSGDCentred(nnUNetTrainerMedDisSeg):
    """from-scratch study: scratchSGD with the batch-centred cosine form"""
    recipe = replace(MEDDISSEG, **SCRATCH_SGD_CENTRED)


class nnUNetTrainerMedDisSeg_scratchAdam(nnUNetTrainerMedDisSeg):
    """from-scratch study: Adam 1e-3 for every group, cosine dispersive loss"""
    recipe = replace(MEDDISSEG, **SCRATCH_ADAM)


class nnUNetTrainerMedDisSeg_plainSGD(nnUNetTrainerMedDisSeg):
    """from-scratch study: the bare network (no Stage I, final logits only) with scratchSGD's rates"""
    recipe = replace(MEDDISSEG, **PLAIN_TRAINING, **SCRATCH_SGD)


class nnUNetTrainerMedDisSeg_plainAdam(nnUNetTrainerMedDisSeg):
    """from-scratch study: the bare network with scratchAdam's rates"""
    recipe = replace(MEDDISSEG, **PLAIN_TRAINING, **SCRATCH_ADAM)


class nnUNetTrainerMedDisSeg_plainPaper(nnUNetTrainerMedDisSeg):
    """from-scratch study: the bare network with the paper's rates"""
    recipe = replace(MEDDISSEG, **PLAIN_TRAINING)


class nnUNetTrainerMedDisSeg_cosineCentred(nnUNetTrainerMedDisSeg):
    """from-scratch study: the batch-centred cosine dispersive loss"""
    recipe = replace(MEDDISSEG, dispersive_variant="infonce_cosine_centred")


class nnUNetTrainerMedDisSeg_runningStatistics(nnUNetTrainerMedDisSeg):
    """BatchNorm statistics study: also keeps checkpoint_stage1.pth"""
    recipe = replace(MEDDISSEG, stage1_checkpoint=True)


class nnUNetTrainerMedDisSeg_plainPaperRunningStatistics(nnUNetTrainerMedDisSeg):
    """BatchNorm statistics study: plainPaper, also keeps checkpoint_stage1.pth"""
    recipe = replace(MEDDISSEG, **PLAIN_TRAINING, stage1_checkpoint=True)
