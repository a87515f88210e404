"""Variants of the Med-DisSeg trainer (schedule lengths, ablations).

Each variant overrides one thing, in nnU-Net's style (``nnUNetTrainer_250epochs`` etc.).
"""
import torch

from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

__all__ = ["nnUNetTrainerMedDisSeg_smoke", "nnUNetTrainerMedDisSeg_250epochs", "nnUNetTrainerMedDisSeg_100epochs",
           "nnUNetTrainerMedDisSeg_noDispersive"]


class nnUNetTrainerMedDisSeg_smoke(nnUNetTrainerMedDisSeg):
    """1 epoch of Stage I + 2 epochs of Stage II, 4 training and 2 validation iterations each, a
    checkpoint after every epoch: for tests (interruption in either stage) and a first run on a new
    machine (minutes on a CPU). BatchNorm statistics are re-estimated over 2 training samples (one batch)."""

    batchnorm_calibration_samples = 2

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = 3
        self.stage1_epochs = 1
        self.save_every = 1
        self.num_iterations_per_epoch = 4
        self.num_val_iterations_per_epoch = 2


class nnUNetTrainerMedDisSeg_250epochs(nnUNetTrainerMedDisSeg):
    """250 epochs (Stage I: the first 62)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = 250


class nnUNetTrainerMedDisSeg_100epochs(nnUNetTrainerMedDisSeg):
    """100 epochs (Stage I: the first 25)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = 100


class nnUNetTrainerMedDisSeg_noDispersive(nnUNetTrainerMedDisSeg):
    """Ablation: no dispersive loss in either stage (its diagnostics are still logged)."""

    lambda_dispersive_stage1 = 0.0
    lambda_dispersive_stage2 = 0.0
