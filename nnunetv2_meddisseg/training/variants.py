"""Every variant of our trainers: the trainer's default recipe with the settings its name says.

A new one goes here and into ``__all__``; one of your own goes in a module on ``nnUNet_extTrainer``::

    from dataclasses import replace
    from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg
    class nnUNetTrainerMedDisSeg_tau0p3(nnUNetTrainerMedDisSeg):
        recipe = replace(nnUNetTrainerMedDisSeg.recipe, dispersive_tau=0.3)

Architecture options are plans, not recipes (``nnUNetv2_meddisseg_plan --no_elat / --activation relu / --no_cbat /
--added_norm``). nnU-Net finds variants by class name through ``nnUNet_extTrainer``;
``python -m nnunetv2_meddisseg.trainer_path --list`` prints them; finished studies' arms: ``ablation.study_trainers``.
"""
from dataclasses import replace
from types import MappingProxyType
from typing import List, Optional

import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe
from nnunetv2_meddisseg.training.seeding import seed_epoch
from nnunetv2_meddisseg.training.trainer_base import final_validation_skipped, peak_memory_line, run_lines, set_up_run

__all__ = [
    "nnUNetTrainerMedDisSeg_smoke", "nnUNetTrainerMedDisSeg_250epochs", "nnUNetTrainerMedDisSeg_100epochs",
    "nnUNetTrainerMedDisSeg_demo",
    "nnUNetTrainerMedDisSeg_noDispersive", "nnUNetTrainerMedDisSeg_dispersiveStage1Only",
    "nnUNetTrainerMedDisSeg_dispersiveStage2Only", "nnUNetTrainerMedDisSeg_cosine", "nnUNetTrainerMedDisSeg_hinge",
    "nnUNetTrainerMedDisSeg_covariance", "nnUNetTrainerMedDisSeg_middle", "nnUNetTrainerMedDisSeg_late",
    "nnUNetTrainerMedDisSeg_allLayers", "nnUNetTrainerMedDisSeg_tau0p1", "nnUNetTrainerMedDisSeg_tau0p5",
    "nnUNetTrainerMedDisSeg_tau1p0", "nnUNetTrainerMedDisSeg_lambda0p2", "nnUNetTrainerMedDisSeg_lambda1p0",
    "nnUNetTrainerMedDisSeg_noStage1",
    "nnUNetTrainerDispersive_smoke", "nnUNetTrainerDispersive_infonceL2", "nnUNetTrainerDispersive_cosine",
    "nnUNetTrainerBaseline", "nnUNetTrainerBaseline_smoke", "nnUNetTrainerBaseline_demo",
]

MEDDISSEG = nnUNetTrainerMedDisSeg.recipe
DISPERSIVE = nnUNetTrainerDispersive.recipe

#: nnU-Net's recipe from scratch: SGD (Nesterov, momentum 0.99), 1e-2 for all groups and stages; scale-invariant cosine
SCRATCH_SGD = MappingProxyType({"optimizer": "sgd", "stage1_lr": 1e-2, "stage2_lr": 1e-2,
                                "stage2_encoder_lr": 1e-2, "dispersive_variant": "infonce_cosine"})
#: ``SCRATCH_SGD``, centred cosine: at these rates the uncentred one lets ELAT gates shrink non-negative features
SCRATCH_SGD_CENTRED = MappingProxyType(dict(SCRATCH_SGD, dispersive_variant="infonce_cosine_centred"))
#: Adam at 1e-3 for every group and stage (no 10x lower encoder rate); cosine dispersive loss
SCRATCH_ADAM = MappingProxyType({"optimizer": "adam", "stage1_lr": 1e-3, "stage2_lr": 1e-3,
                                 "stage2_encoder_lr": 1e-3, "dispersive_variant": "infonce_cosine"})
#: the bare network: no Stage I, Dice+CE on the final logits only, no auxiliary or dispersive losses
PLAIN_TRAINING = MappingProxyType({"stage1_fraction": 0.0, "path_supervision_weight": 0.0, "fg_bg_weight": 0.0,
                                   "complementarity_weight": 0.0, "lambda_dispersive_stage1": 0.0,
                                   "lambda_dispersive_stage2": 0.0})
#: tests, first runs: 3 epochs of 4 + 2 validation iterations, a checkpoint after each (Med-DisSeg: 1 of Stage I)
SMOKE_SCHEDULE = MappingProxyType({"num_epochs": 3, "iterations_per_epoch": 4, "val_iterations_per_epoch": 2,
                                   "save_every": 1})
#: ``nnUNetv2_meddisseg_demo``: 8 epochs of 15 training and 3 validation iterations
DEMO_SCHEDULE = MappingProxyType({"num_epochs": 8, "iterations_per_epoch": 15, "val_iterations_per_epoch": 3})


class nnUNetTrainerMedDisSeg_smoke(nnUNetTrainerMedDisSeg):
    """3 epochs (1 of Stage I) of 4 iterations, a checkpoint after each: first contact, tests"""
    recipe = replace(MEDDISSEG, **SMOKE_SCHEDULE, stage1_epochs=1, batchnorm_calibration_samples=2)


class nnUNetTrainerMedDisSeg_250epochs(nnUNetTrainerMedDisSeg):
    """250 epochs, the first quarter Stage I"""
    recipe = replace(MEDDISSEG, num_epochs=250)


class nnUNetTrainerMedDisSeg_100epochs(nnUNetTrainerMedDisSeg):
    """100 epochs, the first quarter Stage I"""
    recipe = replace(MEDDISSEG, num_epochs=100)


class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg):
    """nnUNetv2_meddisseg_demo: 8 epochs of 15 iterations from random initialisation, Adam 1e-3"""
    recipe = replace(MEDDISSEG, **DEMO_SCHEDULE, **SCRATCH_ADAM, batchnorm_calibration_samples=16,
                     batchnorm_calibration_augmentation=False)


class nnUNetTrainerMedDisSeg_noDispersive(nnUNetTrainerMedDisSeg):
    """ablation: no dispersive loss in either stage"""
    recipe = replace(MEDDISSEG, lambda_dispersive_stage1=0.0, lambda_dispersive_stage2=0.0)


class nnUNetTrainerMedDisSeg_dispersiveStage1Only(nnUNetTrainerMedDisSeg):
    """ablation: the dispersive loss in Stage I only"""
    recipe = replace(MEDDISSEG, lambda_dispersive_stage2=0.0)


class nnUNetTrainerMedDisSeg_dispersiveStage2Only(nnUNetTrainerMedDisSeg):
    """ablation: the dispersive loss in Stage II only"""
    recipe = replace(MEDDISSEG, lambda_dispersive_stage1=0.0)


class nnUNetTrainerMedDisSeg_cosine(nnUNetTrainerMedDisSeg):
    """ablation: InfoNCE on cosine distances"""
    recipe = replace(MEDDISSEG, dispersive_variant="infonce_cosine")


class nnUNetTrainerMedDisSeg_hinge(nnUNetTrainerMedDisSeg):
    """ablation: the hinge form of the dispersive loss"""
    recipe = replace(MEDDISSEG, dispersive_variant="hinge")


class nnUNetTrainerMedDisSeg_covariance(nnUNetTrainerMedDisSeg):
    """ablation: the covariance form of the dispersive loss"""
    recipe = replace(MEDDISSEG, dispersive_variant="covariance")


class nnUNetTrainerMedDisSeg_middle(nnUNetTrainerMedDisSeg):
    """ablation: the dispersive loss on the middle features (x4)"""
    recipe = replace(MEDDISSEG, dispersive_placement="middle")


class nnUNetTrainerMedDisSeg_late(nnUNetTrainerMedDisSeg):
    """ablation: the dispersive loss on the last feature before the logits"""
    recipe = replace(MEDDISSEG, dispersive_placement="late")


class nnUNetTrainerMedDisSeg_allLayers(nnUNetTrainerMedDisSeg):
    """ablation: the mean dispersive loss of the early, middle and late features"""
    recipe = replace(MEDDISSEG, dispersive_placement="all")


class nnUNetTrainerMedDisSeg_tau0p1(nnUNetTrainerMedDisSeg):
    """ablation: temperature 0.1 (default 0.8)"""
    recipe = replace(MEDDISSEG, dispersive_tau=0.1)


class nnUNetTrainerMedDisSeg_tau0p5(nnUNetTrainerMedDisSeg):
    """ablation: temperature 0.5 (default 0.8)"""
    recipe = replace(MEDDISSEG, dispersive_tau=0.5)


class nnUNetTrainerMedDisSeg_tau1p0(nnUNetTrainerMedDisSeg):
    """ablation: temperature 1.0 (default 0.8)"""
    recipe = replace(MEDDISSEG, dispersive_tau=1.0)


class nnUNetTrainerMedDisSeg_lambda0p2(nnUNetTrainerMedDisSeg):
    """ablation: Stage II dispersive weight 0.2 (default 0.6)"""
    recipe = replace(MEDDISSEG, lambda_dispersive_stage2=0.2)


class nnUNetTrainerMedDisSeg_lambda1p0(nnUNetTrainerMedDisSeg):
    """ablation: Stage II dispersive weight 1.0 (default 0.6)"""
    recipe = replace(MEDDISSEG, lambda_dispersive_stage2=1.0)


class nnUNetTrainerMedDisSeg_noStage1(nnUNetTrainerMedDisSeg):
    """ablation: no Stage I, the whole network trains from the first epoch"""
    recipe = replace(MEDDISSEG, stage1_fraction=0.0)


class nnUNetTrainerDispersive_smoke(nnUNetTrainerDispersive):
    """1 epoch of 4 iterations: tests"""
    recipe = replace(DISPERSIVE, num_epochs=1, iterations_per_epoch=4, val_iterations_per_epoch=2)


class nnUNetTrainerDispersive_infonceL2(nnUNetTrainerDispersive):
    """the paper's InfoNCE-L2 on raw features"""
    recipe = replace(DISPERSIVE, dispersive_variant="infonce_l2")


class nnUNetTrainerDispersive_cosine(nnUNetTrainerDispersive):
    """the uncentred cosine form"""
    recipe = replace(DISPERSIVE, dispersive_variant="infonce_cosine")


class nnUNetTrainerBaseline(nnUNetTrainer):
    """default nnU-Net (network, loss, SGD, augmentation), seeded as our trainers are"""
    #: run seed; None: ``nnUNet_meddisseg_seed`` if set, else random (``seeding``)
    seed: Optional[int] = None
    recipe = ScheduleRecipe()

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        set_up_run(self, type(self).recipe)

    def initialize(self) -> None:
        if not self.was_initialized:
            seed_epoch(self.run_seed, None, self.local_rank)  # the initial weights depend on the run seed only
        super().initialize()

    def on_train_start(self) -> None:
        super().on_train_start()
        for line in run_lines(self):
            self.print_to_log_file(line)

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        if not final_validation_skipped(self):
            super().perform_actual_validation(save_probabilities)

    def on_epoch_start(self) -> None:
        super().on_epoch_start()
        seed_epoch(self.run_seed, self.current_epoch, self.local_rank)

    def on_train_epoch_end(self, train_outputs: List[dict]) -> None:
        super().on_train_epoch_end(train_outputs)
        peak = peak_memory_line(self)
        if peak:
            self.print_to_log_file(peak)


class nnUNetTrainerBaseline_smoke(nnUNetTrainerBaseline):
    """nnUNetTrainerBaseline for 3 epochs of 4 iterations: tests"""
    recipe = ScheduleRecipe(num_epochs=3, iterations_per_epoch=4, val_iterations_per_epoch=2)


class nnUNetTrainerBaseline_demo(nnUNetTrainerBaseline):
    """nnUNetTrainerBaseline on the demo's schedule"""
    recipe = ScheduleRecipe(**DEMO_SCHEDULE)
