"""The arms of finished studies, one line each; kept so that their models still predict by name.

The from-scratch study (``benchmarks/quality.py``; results in ``benchmarks/RESULTS.md``: "From-scratch study
at the CPU budget", "SGD from scratch and the early-feature collapse") and the BatchNorm statistics study
(``runningStatistics`` arms, RESULTS.md "BatchNorm statistics at small batches"). nnU-Net finds them through
``nnUNet_extTrainer`` like the trainers of ``training.variants``; their recipes are in ``training.recipes``.
"""
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.recipes import RECIPES

__all__ = [
    "nnUNetTrainerMedDisSeg_paperSettings", "nnUNetTrainerMedDisSeg_scratchSGD",
    "nnUNetTrainerMedDisSeg_scratchSGDCentred", "nnUNetTrainerMedDisSeg_scratchAdam", "nnUNetTrainerMedDisSeg_plainSGD",
    "nnUNetTrainerMedDisSeg_plainAdam", "nnUNetTrainerMedDisSeg_plainPaper", "nnUNetTrainerMedDisSeg_cosineCentred",
    "nnUNetTrainerMedDisSeg_runningStatistics", "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics",
]

class nnUNetTrainerMedDisSeg_paperSettings(nnUNetTrainerMedDisSeg): "from-scratch study: the default recipe under the name result tables use"; recipe = RECIPES["MedDisSeg_paperSettings"]
class nnUNetTrainerMedDisSeg_scratchSGD(nnUNetTrainerMedDisSeg): "from-scratch study: SGD 1e-2 for every group, cosine dispersive loss"; recipe = RECIPES["MedDisSeg_scratchSGD"]
class nnUNetTrainerMedDisSeg_scratchSGDCentred(nnUNetTrainerMedDisSeg): "from-scratch study: scratchSGD with the batch-centred cosine form"; recipe = RECIPES["MedDisSeg_scratchSGDCentred"]
class nnUNetTrainerMedDisSeg_scratchAdam(nnUNetTrainerMedDisSeg): "from-scratch study: Adam 1e-3 for every group, cosine dispersive loss"; recipe = RECIPES["MedDisSeg_scratchAdam"]
class nnUNetTrainerMedDisSeg_plainSGD(nnUNetTrainerMedDisSeg): "from-scratch study: the bare network (no Stage I, final logits only) with scratchSGD's rates"; recipe = RECIPES["MedDisSeg_plainSGD"]
class nnUNetTrainerMedDisSeg_plainAdam(nnUNetTrainerMedDisSeg): "from-scratch study: the bare network with scratchAdam's rates"; recipe = RECIPES["MedDisSeg_plainAdam"]
class nnUNetTrainerMedDisSeg_plainPaper(nnUNetTrainerMedDisSeg): "from-scratch study: the bare network with the paper's rates"; recipe = RECIPES["MedDisSeg_plainPaper"]
class nnUNetTrainerMedDisSeg_cosineCentred(nnUNetTrainerMedDisSeg): "from-scratch study: the batch-centred cosine dispersive loss"; recipe = RECIPES["MedDisSeg_cosineCentred"]
class nnUNetTrainerMedDisSeg_runningStatistics(nnUNetTrainerMedDisSeg): "BatchNorm statistics study: also keeps checkpoint_stage1.pth"; recipe = RECIPES["MedDisSeg_runningStatistics"]
class nnUNetTrainerMedDisSeg_plainPaperRunningStatistics(nnUNetTrainerMedDisSeg): "BatchNorm statistics study: plainPaper, also keeps checkpoint_stage1.pth"; recipe = RECIPES["MedDisSeg_plainPaperRunningStatistics"]
