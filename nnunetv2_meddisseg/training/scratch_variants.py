"""Training recipes for a Med-DisSeg encoder that starts from random initialisation, and the
paper's dispersive-loss form for ``nnUNetTrainerDispersive``: the arms of the from-scratch study
(``benchmarks/quality.py --methods ...``, results in ``benchmarks/RESULTS.md``).

Each variant overrides one thing: the ``scratch_settings`` its base applies when the plans name no
``encoder_weights`` (with pretrained weights every variant trains with the paper's settings, except
the ``_plain`` ones, which also drop the method's extra losses).
"""
from types import MappingProxyType

from batchgenerators.utilities.file_and_folder_operations import join

from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import STAGE_1, nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive

__all__ = ["SCRATCH_SGD", "SCRATCH_SGD_CENTRED", "SCRATCH_ADAM", "PLAIN_TRAINING",
           "nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
           "nnUNetTrainerMedDisSeg_scratchSGDCentred",
           "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD",
           "nnUNetTrainerMedDisSeg_plainAdam", "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
           "nnUNetTrainerDispersive_infonceL2", "nnUNetTrainerDispersive_cosine",
           "nnUNetTrainerMedDisSeg_runningStatistics", "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics"]

#: nnU-Net's own recipe for networks trained from scratch: SGD (Nesterov, momentum 0.99) at 1e-2 for
#: every group in both stages; the scale-invariant cosine form of the dispersive loss
SCRATCH_SGD = MappingProxyType({"optimizer_name": "sgd", "stage1_lr": 1e-2, "stage2_lr": 1e-2,
                                "stage2_encoder_lr": 1e-2, "dispersive_variant": "infonce_cosine"})
#: ``SCRATCH_SGD`` with the batch-centred cosine form of the dispersive loss (the uncentred one lets the
#: ELAT gates shrink the non-negative early features towards zero at these rates)
SCRATCH_SGD_CENTRED = MappingProxyType(dict(SCRATCH_SGD, dispersive_variant="infonce_cosine_centred"))
#: Adam at 1e-3 for every group in both stages (no 10x lower encoder rate); cosine dispersive loss
SCRATCH_ADAM = MappingProxyType({"optimizer_name": "adam", "stage1_lr": 1e-3, "stage2_lr": 1e-3,
                                 "stage2_encoder_lr": 1e-3, "dispersive_variant": "infonce_cosine"})
#: the bare network: no Stage I, Dice+CE on the final logits only, no auxiliary or dispersive losses
PLAIN_TRAINING = MappingProxyType({"stage1_fraction": 0.0, "path_supervision_weight": 0.0, "fg_bg_weight": 0.0,
                                   "complementarity_weight": 0.0, "lambda_dispersive_stage1": 0.0,
                                   "lambda_dispersive_stage2": 0.0})


class nnUNetTrainerMedDisSeg_paperSettings(nnUNetTrainerMedDisSeg):
    """The paper's settings (Adam 1e-4, Stage II encoder 1e-5, InfoNCE-L2) also from random initialisation."""

    scratch_settings = MappingProxyType({})


class nnUNetTrainerMedDisSeg_scratchSGD(nnUNetTrainerMedDisSeg):
    """From random initialisation: ``SCRATCH_SGD``."""

    scratch_settings = SCRATCH_SGD


class nnUNetTrainerMedDisSeg_scratchSGDCentred(nnUNetTrainerMedDisSeg):
    """From random initialisation: ``SCRATCH_SGD_CENTRED``."""

    scratch_settings = SCRATCH_SGD_CENTRED


class nnUNetTrainerMedDisSeg_scratchAdam(nnUNetTrainerMedDisSeg):
    """From random initialisation: ``SCRATCH_ADAM``."""

    scratch_settings = SCRATCH_ADAM


class _PlainTraining(nnUNetTrainerMedDisSeg):
    """The bare network (``PLAIN_TRAINING``), with or without pretrained weights."""

    stage1_fraction = 0.0
    path_supervision_weight = 0.0
    fg_bg_weight = 0.0
    complementarity_weight = 0.0
    lambda_dispersive_stage1 = 0.0
    lambda_dispersive_stage2 = 0.0


class nnUNetTrainerMedDisSeg_plainSGD(_PlainTraining):
    """The bare network, trained with ``SCRATCH_SGD``'s optimizer from random initialisation."""

    scratch_settings = SCRATCH_SGD


class nnUNetTrainerMedDisSeg_plainAdam(_PlainTraining):
    """The bare network, trained with ``SCRATCH_ADAM``'s optimizer from random initialisation."""

    scratch_settings = SCRATCH_ADAM


class nnUNetTrainerMedDisSeg_plainPaper(_PlainTraining):
    """The bare network with the paper's optimizer settings (Adam 1e-4, encoder 1e-5 after epoch 0)."""

    scratch_settings = MappingProxyType({})


class nnUNetTrainerMedDisSeg_cosineCentred(nnUNetTrainerMedDisSeg):
    """The paper's settings with the batch-centred cosine form of the dispersive loss instead of InfoNCE-L2
    (neither scale nor shrinking can lower it)."""

    dispersive_variant = "infonce_cosine_centred"


class nnUNetTrainerDispersive_infonceL2(nnUNetTrainerDispersive):
    """nnUNetTrainerDispersive with the paper's ``infonce_l2`` form on raw (not normalised) features."""

    dispersive_variant = "infonce_l2"


class nnUNetTrainerDispersive_cosine(nnUNetTrainerDispersive):
    """nnUNetTrainerDispersive with the uncentred cosine form (``infonce_cosine``), its default until the
    centred form was chosen on validation data."""

    dispersive_variant = "infonce_cosine"


class _RunningStatistics(nnUNetTrainerMedDisSeg):
    """No re-estimation of BatchNorm's statistics: checkpoints keep the running averages of training, and a
    copy of the model at the end of Stage I is kept as ``checkpoint_stage1.pth``. The arms of the BatchNorm
    statistics study (``benchmarks/batchnorm_statistics.py``), which re-estimates them afterwards with the
    trainer's own ``_recalibrate_batchnorm``: that changes no weight, so it gives what the trainer with
    re-estimation would have written."""

    batchnorm_calibration_samples = 0

    def on_epoch_end(self) -> None:
        end_of_stage1 = self.training_stage == STAGE_1 and self.current_epoch == self.stage1_epochs - 1
        super().on_epoch_end()
        if end_of_stage1:
            self.current_epoch -= 1  # the checkpoint records the finished epoch
            self.save_checkpoint(join(self.output_folder, "checkpoint_stage1.pth"))
            self.current_epoch += 1


class nnUNetTrainerMedDisSeg_runningStatistics(_RunningStatistics):
    """``nnUNetTrainerMedDisSeg`` with BatchNorm's running averages of training (``_RunningStatistics``)."""


class nnUNetTrainerMedDisSeg_plainPaperRunningStatistics(_RunningStatistics, nnUNetTrainerMedDisSeg_plainPaper):
    """The bare network (``nnUNetTrainerMedDisSeg_plainPaper``) with BatchNorm's running averages of training."""
