"""Training recipes for a Med-DisSeg encoder that starts from random initialisation, and the
paper's dispersive-loss form for ``nnUNetTrainerDispersive``: the arms of the from-scratch study
(``benchmarks/quality.py --methods ...``, results in ``benchmarks/RESULTS.md``).

Each variant overrides one thing: the ``scratch_settings`` its base applies when the plans name no
``encoder_weights`` (with pretrained weights every variant trains with the paper's settings, except
the ``_plain`` ones, which also drop the method's extra losses).
"""
from types import MappingProxyType

from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive

__all__ = ["SCRATCH_SGD", "SCRATCH_SGD_CENTRED", "SCRATCH_ADAM", "PLAIN_TRAINING",
           "nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
           "nnUNetTrainerMedDisSeg_scratchSGDCentred",
           "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD",
           "nnUNetTrainerMedDisSeg_plainAdam", "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
           "nnUNetTrainerDispersive_infonceL2", "nnUNetTrainerDispersive_cosine"]

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
