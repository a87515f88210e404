"""Every named recipe of our trainers: ``RECIPES["MedDisSeg_tau0p5"]`` is the recipe of
``nnUNetTrainerMedDisSeg_tau0p5`` (``variants``); each variant changes the settings its name says and
keeps the rest (``dataclasses.replace`` of its trainer's default recipe).

A variant of your own takes three lines (a module on ``nnUNet_extTrainer``)::

    from dataclasses import replace
    from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg
    class nnUNetTrainerMedDisSeg_tau0p3(nnUNetTrainerMedDisSeg): recipe = replace(nnUNetTrainerMedDisSeg.recipe, dispersive_tau=0.3)

Architecture options are no recipes: they are plans (``nnUNetv2_meddisseg_plan --no-elat / --activation relu /
--no-cbat / --added-norm``), used with the default trainer.
"""
from dataclasses import replace
from types import MappingProxyType
from typing import Mapping

from nnunetv2_meddisseg.training.recipe import (DispersiveRecipe, MedDisSegRecipe, PaperScheduleRecipe,
                                                ScheduleRecipe)

__all__ = ["RECIPES", "ALIASES", "MEDDISSEG", "DISPERSIVE", "SCRATCH_SGD", "SCRATCH_SGD_CENTRED", "SCRATCH_ADAM",
           "PLAIN_TRAINING", "SMOKE_SCHEDULE", "DEMO_SCHEDULE"]

#: the paper's recipe (``nnUNetTrainerMedDisSeg``)
MEDDISSEG = MedDisSegRecipe()
#: ``nnUNetTrainerDispersive``
DISPERSIVE = DispersiveRecipe()

#: nnU-Net's own recipe for networks trained from scratch: SGD (Nesterov, momentum 0.99) at 1e-2 for every
#: group in both stages; the scale-invariant cosine form of the dispersive loss
SCRATCH_SGD = MappingProxyType({"optimizer": "sgd", "stage1_lr": 1e-2, "stage2_lr": 1e-2,
                                "stage2_encoder_lr": 1e-2, "dispersive_variant": "infonce_cosine"})
#: ``SCRATCH_SGD`` with the batch-centred cosine form (the uncentred one lets the ELAT gates shrink the
#: non-negative early features towards zero at these rates)
SCRATCH_SGD_CENTRED = MappingProxyType(dict(SCRATCH_SGD, dispersive_variant="infonce_cosine_centred"))
#: Adam at 1e-3 for every group in both stages (no 10x lower encoder rate); cosine dispersive loss
SCRATCH_ADAM = MappingProxyType({"optimizer": "adam", "stage1_lr": 1e-3, "stage2_lr": 1e-3,
                                 "stage2_encoder_lr": 1e-3, "dispersive_variant": "infonce_cosine"})
#: the bare network: no Stage I, Dice+CE on the final logits only, no auxiliary or dispersive losses
PLAIN_TRAINING = MappingProxyType({"stage1_fraction": 0.0, "path_supervision_weight": 0.0, "fg_bg_weight": 0.0,
                                   "complementarity_weight": 0.0, "lambda_dispersive_stage1": 0.0,
                                   "lambda_dispersive_stage2": 0.0})
#: tests and a first run on a new machine: 3 epochs of 4 training and 2 validation iterations, a checkpoint
#: after every epoch (Med-DisSeg: 1 epoch of Stage I)
SMOKE_SCHEDULE = MappingProxyType({"num_epochs": 3, "iterations_per_epoch": 4, "val_iterations_per_epoch": 2,
                                   "save_every": 1})
#: ``nnUNetv2_meddisseg_demo``: 8 epochs of 15 training and 3 validation iterations
DEMO_SCHEDULE = MappingProxyType({"num_epochs": 8, "iterations_per_epoch": 15, "val_iterations_per_epoch": 3})

_MEDDISSEG_VARIANTS: Mapping[str, MedDisSegRecipe] = {
    # schedules
    "smoke": replace(MEDDISSEG, **SMOKE_SCHEDULE, stage1_epochs=1, batchnorm_calibration_samples=2),
    "250epochs": replace(MEDDISSEG, num_epochs=250),
    "100epochs": replace(MEDDISSEG, num_epochs=100),
    # the demo trains from random initialisation for 120 iterations: Adam 1e-3 for every group, BatchNorm
    # statistics over 16 plain training samples (of its 19 training cases)
    "demo": replace(MEDDISSEG, **DEMO_SCHEDULE, from_scratch=SCRATCH_ADAM, batchnorm_calibration_samples=16,
                    batchnorm_calibration_augmentation=False),
    # the paper's ablations: the dispersive loss per stage, its form, placement, temperature, Stage II weight
    "noDispersive": replace(MEDDISSEG, lambda_dispersive_stage1=0.0, lambda_dispersive_stage2=0.0),
    "dispersiveStage1Only": replace(MEDDISSEG, lambda_dispersive_stage2=0.0),
    "dispersiveStage2Only": replace(MEDDISSEG, lambda_dispersive_stage1=0.0),
    "cosine": replace(MEDDISSEG, dispersive_variant="infonce_cosine"),
    "hinge": replace(MEDDISSEG, dispersive_variant="hinge"),
    "covariance": replace(MEDDISSEG, dispersive_variant="covariance"),
    "middle": replace(MEDDISSEG, dispersive_placement="middle"),
    "late": replace(MEDDISSEG, dispersive_placement="late"),
    "allLayers": replace(MEDDISSEG, dispersive_placement="all"),
    "tau0p1": replace(MEDDISSEG, dispersive_tau=0.1),
    "tau0p5": replace(MEDDISSEG, dispersive_tau=0.5),
    "tau1p0": replace(MEDDISSEG, dispersive_tau=1.0),
    "lambda0p2": replace(MEDDISSEG, lambda_dispersive_stage2=0.2),
    "lambda1p0": replace(MEDDISSEG, lambda_dispersive_stage2=1.0),
    # no Stage I: the full network trains in Stage II from the first epoch
    "noStage1": replace(MEDDISSEG, stage1_fraction=0.0),
    # from random initialisation (the plans name no encoder_weights): the from-scratch study's arms
    # (classes in ablation.study_trainers)
    "scratchSGD": replace(MEDDISSEG, from_scratch=SCRATCH_SGD),
    "scratchSGDCentred": replace(MEDDISSEG, from_scratch=SCRATCH_SGD_CENTRED),
    "scratchAdam": replace(MEDDISSEG, from_scratch=SCRATCH_ADAM),
    "plainSGD": replace(MEDDISSEG, **PLAIN_TRAINING, from_scratch=SCRATCH_SGD),
    "plainAdam": replace(MEDDISSEG, **PLAIN_TRAINING, from_scratch=SCRATCH_ADAM),
    "plainPaper": replace(MEDDISSEG, **PLAIN_TRAINING),
    "cosineCentred": replace(MEDDISSEG, dispersive_variant="infonce_cosine_centred"),
    # BatchNorm's running averages of training, and a copy of the model at the end of Stage I
    # (checkpoint_stage1.pth): the BatchNorm statistics study's arms (classes in ablation.study_trainers)
    "runningStatistics": replace(MEDDISSEG, stage1_checkpoint=True),
    "plainPaperRunningStatistics": replace(MEDDISSEG, **PLAIN_TRAINING, stage1_checkpoint=True),
}

#: variants whose recipe equals another's under a name result tables use: alias -> the recipe it equals
ALIASES: Mapping[str, str] = MappingProxyType({
    "MedDisSeg_paperSettings": "MedDisSeg",  # the paper's settings also from random initialisation (the default)
})

RECIPES: Mapping[str, ScheduleRecipe] = MappingProxyType({
    "MedDisSeg": MEDDISSEG,
    **{f"MedDisSeg_{name}": recipe for name, recipe in _MEDDISSEG_VARIANTS.items()},
    "MedDisSeg_paper": PaperScheduleRecipe(),
    "MedDisSeg_paperSettings": MEDDISSEG,
    "Dispersive": DISPERSIVE,
    "Dispersive_smoke": replace(DISPERSIVE, num_epochs=1, iterations_per_epoch=4, val_iterations_per_epoch=2),
    # the paper's InfoNCE-L2 on raw features, and the uncentred cosine form
    "Dispersive_infonceL2": replace(DISPERSIVE, dispersive_variant="infonce_l2"),
    "Dispersive_cosine": replace(DISPERSIVE, dispersive_variant="infonce_cosine"),
    # default nnU-Net (network, loss, SGD, augmentation), seeded as our trainers are
    "Baseline": ScheduleRecipe(),
    "Baseline_smoke": ScheduleRecipe(num_epochs=3, iterations_per_epoch=4, val_iterations_per_epoch=2),
    "Baseline_demo": ScheduleRecipe(**DEMO_SCHEDULE),
})
