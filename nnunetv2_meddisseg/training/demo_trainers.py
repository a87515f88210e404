"""The short, equal schedules that ``nnUNetv2_meddisseg_demo`` trains: default nnU-Net and Med-DisSeg
see the same number of training iterations (``DEMO_EPOCHS x DEMO_ITERATIONS``)."""
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

__all__ = ["nnUNetTrainerBaseline_demo", "nnUNetTrainerMedDisSeg_demo", "nnUNetTrainerBaseline_smoke", "DEMO_EPOCHS",
           "DEMO_ITERATIONS"]

DEMO_EPOCHS = 8
DEMO_ITERATIONS = 15
DEMO_VAL_ITERATIONS = 3


def _demo_schedule(trainer: nnUNetTrainer) -> None:
    trainer.num_epochs = DEMO_EPOCHS
    trainer.num_iterations_per_epoch = DEMO_ITERATIONS
    trainer.num_val_iterations_per_epoch = DEMO_VAL_ITERATIONS


class nnUNetTrainerBaseline_demo(nnUNetTrainer):
    """Default nnU-Net (network, loss, SGD, augmentation) on the demo's short schedule."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        _demo_schedule(self)


class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg):
    """Med-DisSeg on the demo's short schedule (the first quarter of the epochs is Stage I)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        _demo_schedule(self)


class nnUNetTrainerBaseline_smoke(nnUNetTrainer):
    """Default nnU-Net on the schedule of ``nnUNetTrainerMedDisSeg_smoke`` (3 epochs of 4 training and 2
    validation iterations): ``nnUNetv2_meddisseg_demo --schedule smoke`` and tests."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = 3
        self.num_iterations_per_epoch = 4
        self.num_val_iterations_per_epoch = 2
