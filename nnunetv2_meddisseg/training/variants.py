"""Every variant of our trainers, one line each: the trainer class with a named recipe (``recipes.RECIPES``)
and a docstring that says what it is.

nnU-Net finds them by class name (``-tr nnUNetTrainerMedDisSeg_tau0p5``) through ``nnUNet_extTrainer``
(``nnunet_trainers/meddisseg_trainers.py``); ``python -m nnunetv2_meddisseg.trainer_path --list`` prints them.
The arms of finished studies are in ``nnunetv2_meddisseg.ablation.study_trainers``.
"""
from nnunetv2_meddisseg.training.seeded_trainer import SeededTrainer
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.recipes import RECIPES

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

class nnUNetTrainerMedDisSeg_smoke(nnUNetTrainerMedDisSeg): "3 epochs (1 of Stage I) of 4 iterations, a checkpoint after each: first contact, tests"; recipe = RECIPES["MedDisSeg_smoke"]
class nnUNetTrainerMedDisSeg_250epochs(nnUNetTrainerMedDisSeg): "250 epochs, the first quarter Stage I"; recipe = RECIPES["MedDisSeg_250epochs"]
class nnUNetTrainerMedDisSeg_100epochs(nnUNetTrainerMedDisSeg): "100 epochs, the first quarter Stage I"; recipe = RECIPES["MedDisSeg_100epochs"]
class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg): "nnUNetv2_meddisseg_demo: 8 epochs of 15 iterations from random initialisation, Adam 1e-3"; recipe = RECIPES["MedDisSeg_demo"]
class nnUNetTrainerMedDisSeg_noDispersive(nnUNetTrainerMedDisSeg): "ablation: no dispersive loss in either stage"; recipe = RECIPES["MedDisSeg_noDispersive"]
class nnUNetTrainerMedDisSeg_dispersiveStage1Only(nnUNetTrainerMedDisSeg): "ablation: the dispersive loss in Stage I only"; recipe = RECIPES["MedDisSeg_dispersiveStage1Only"]
class nnUNetTrainerMedDisSeg_dispersiveStage2Only(nnUNetTrainerMedDisSeg): "ablation: the dispersive loss in Stage II only"; recipe = RECIPES["MedDisSeg_dispersiveStage2Only"]
class nnUNetTrainerMedDisSeg_cosine(nnUNetTrainerMedDisSeg): "ablation: InfoNCE on cosine distances"; recipe = RECIPES["MedDisSeg_cosine"]
class nnUNetTrainerMedDisSeg_hinge(nnUNetTrainerMedDisSeg): "ablation: the hinge form of the dispersive loss"; recipe = RECIPES["MedDisSeg_hinge"]
class nnUNetTrainerMedDisSeg_covariance(nnUNetTrainerMedDisSeg): "ablation: the covariance form of the dispersive loss"; recipe = RECIPES["MedDisSeg_covariance"]
class nnUNetTrainerMedDisSeg_middle(nnUNetTrainerMedDisSeg): "ablation: the dispersive loss on the middle features (x4)"; recipe = RECIPES["MedDisSeg_middle"]
class nnUNetTrainerMedDisSeg_late(nnUNetTrainerMedDisSeg): "ablation: the dispersive loss on the last feature before the logits"; recipe = RECIPES["MedDisSeg_late"]
class nnUNetTrainerMedDisSeg_allLayers(nnUNetTrainerMedDisSeg): "ablation: the mean dispersive loss of the early, middle and late features"; recipe = RECIPES["MedDisSeg_allLayers"]
class nnUNetTrainerMedDisSeg_tau0p1(nnUNetTrainerMedDisSeg): "ablation: temperature 0.1 (default 0.8)"; recipe = RECIPES["MedDisSeg_tau0p1"]
class nnUNetTrainerMedDisSeg_tau0p5(nnUNetTrainerMedDisSeg): "ablation: temperature 0.5 (default 0.8)"; recipe = RECIPES["MedDisSeg_tau0p5"]
class nnUNetTrainerMedDisSeg_tau1p0(nnUNetTrainerMedDisSeg): "ablation: temperature 1.0 (default 0.8)"; recipe = RECIPES["MedDisSeg_tau1p0"]
class nnUNetTrainerMedDisSeg_lambda0p2(nnUNetTrainerMedDisSeg): "ablation: Stage II dispersive weight 0.2 (default 0.6)"; recipe = RECIPES["MedDisSeg_lambda0p2"]
class nnUNetTrainerMedDisSeg_lambda1p0(nnUNetTrainerMedDisSeg): "ablation: Stage II dispersive weight 1.0 (default 0.6)"; recipe = RECIPES["MedDisSeg_lambda1p0"]
class nnUNetTrainerMedDisSeg_noStage1(nnUNetTrainerMedDisSeg): "ablation: no Stage I, the whole network trains from the first epoch"; recipe = RECIPES["MedDisSeg_noStage1"]
class nnUNetTrainerDispersive_smoke(nnUNetTrainerDispersive): "1 epoch of 4 iterations: tests"; recipe = RECIPES["Dispersive_smoke"]
class nnUNetTrainerDispersive_infonceL2(nnUNetTrainerDispersive): "the paper's InfoNCE-L2 on raw features"; recipe = RECIPES["Dispersive_infonceL2"]
class nnUNetTrainerDispersive_cosine(nnUNetTrainerDispersive): "the uncentred cosine form"; recipe = RECIPES["Dispersive_cosine"]
class nnUNetTrainerBaseline(SeededTrainer): "default nnU-Net (network, loss, SGD, augmentation), seeded as our trainers are"; recipe = RECIPES["Baseline"]
class nnUNetTrainerBaseline_smoke(SeededTrainer): "nnUNetTrainerBaseline for 3 epochs of 4 iterations: tests"; recipe = RECIPES["Baseline_smoke"]
class nnUNetTrainerBaseline_demo(SeededTrainer): "nnUNetTrainerBaseline on the demo's schedule"; recipe = RECIPES["Baseline_demo"]
