"""Every variant of our trainers, one line each: the trainer class with a named recipe (``recipes.RECIPES``).

nnU-Net finds them by class name (``-tr nnUNetTrainerMedDisSeg_tau0p5``) through ``nnUNet_extTrainer``
(``nnunet_trainers``). ``recipes`` says what each changes.
"""
from nnunetv2_meddisseg.training.base import SeededTrainer
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
    "nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
    "nnUNetTrainerMedDisSeg_scratchSGDCentred", "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD",
    "nnUNetTrainerMedDisSeg_plainAdam", "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
    "nnUNetTrainerMedDisSeg_runningStatistics", "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics",
    "nnUNetTrainerDispersive_smoke", "nnUNetTrainerDispersive_infonceL2", "nnUNetTrainerDispersive_cosine",
    "nnUNetTrainerBaseline", "nnUNetTrainerBaseline_smoke", "nnUNetTrainerBaseline_demo",
]


class nnUNetTrainerMedDisSeg_smoke(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_smoke"]
class nnUNetTrainerMedDisSeg_250epochs(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_250epochs"]
class nnUNetTrainerMedDisSeg_100epochs(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_100epochs"]
class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_demo"]
class nnUNetTrainerMedDisSeg_noDispersive(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_noDispersive"]
class nnUNetTrainerMedDisSeg_dispersiveStage1Only(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_dispersiveStage1Only"]
class nnUNetTrainerMedDisSeg_dispersiveStage2Only(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_dispersiveStage2Only"]
class nnUNetTrainerMedDisSeg_cosine(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_cosine"]
class nnUNetTrainerMedDisSeg_hinge(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_hinge"]
class nnUNetTrainerMedDisSeg_covariance(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_covariance"]
class nnUNetTrainerMedDisSeg_middle(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_middle"]
class nnUNetTrainerMedDisSeg_late(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_late"]
class nnUNetTrainerMedDisSeg_allLayers(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_allLayers"]
class nnUNetTrainerMedDisSeg_tau0p1(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_tau0p1"]
class nnUNetTrainerMedDisSeg_tau0p5(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_tau0p5"]
class nnUNetTrainerMedDisSeg_tau1p0(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_tau1p0"]
class nnUNetTrainerMedDisSeg_lambda0p2(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_lambda0p2"]
class nnUNetTrainerMedDisSeg_lambda1p0(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_lambda1p0"]
class nnUNetTrainerMedDisSeg_noStage1(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_noStage1"]
class nnUNetTrainerMedDisSeg_paperSettings(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_paperSettings"]
class nnUNetTrainerMedDisSeg_scratchSGD(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_scratchSGD"]
class nnUNetTrainerMedDisSeg_scratchSGDCentred(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_scratchSGDCentred"]
class nnUNetTrainerMedDisSeg_scratchAdam(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_scratchAdam"]
class nnUNetTrainerMedDisSeg_plainSGD(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_plainSGD"]
class nnUNetTrainerMedDisSeg_plainAdam(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_plainAdam"]
class nnUNetTrainerMedDisSeg_plainPaper(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_plainPaper"]
class nnUNetTrainerMedDisSeg_cosineCentred(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_cosineCentred"]
class nnUNetTrainerMedDisSeg_runningStatistics(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_runningStatistics"]
class nnUNetTrainerMedDisSeg_plainPaperRunningStatistics(nnUNetTrainerMedDisSeg): recipe = RECIPES["MedDisSeg_plainPaperRunningStatistics"]
class nnUNetTrainerDispersive_smoke(nnUNetTrainerDispersive): recipe = RECIPES["Dispersive_smoke"]
class nnUNetTrainerDispersive_infonceL2(nnUNetTrainerDispersive): recipe = RECIPES["Dispersive_infonceL2"]
class nnUNetTrainerDispersive_cosine(nnUNetTrainerDispersive): recipe = RECIPES["Dispersive_cosine"]
class nnUNetTrainerBaseline(SeededTrainer): recipe = RECIPES["Baseline"]
class nnUNetTrainerBaseline_smoke(SeededTrainer): recipe = RECIPES["Baseline_smoke"]
class nnUNetTrainerBaseline_demo(SeededTrainer): recipe = RECIPES["Baseline_demo"]
