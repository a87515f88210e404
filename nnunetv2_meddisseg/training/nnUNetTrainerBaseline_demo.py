"""Default nnU-Net on the short schedule of ``nnUNetv2_meddisseg_demo``: default nnU-Net and Med-DisSeg
(``nnUNetTrainerMedDisSeg_demo``) see the same number of training iterations
(``DEMO_EPOCHS x DEMO_ITERATIONS``)."""
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunetv2_meddisseg.training.base import SeededTrainer

__all__ = ["nnUNetTrainerBaseline_demo", "demo_schedule", "DEMO_EPOCHS", "DEMO_ITERATIONS", "DEMO_VAL_ITERATIONS"]

DEMO_EPOCHS = 8
DEMO_ITERATIONS = 15
DEMO_VAL_ITERATIONS = 3


def demo_schedule(trainer: nnUNetTrainer) -> None:
    """Set the demo's schedule on a trainer (after its ``__init__``)."""
    trainer.num_epochs = DEMO_EPOCHS
    trainer.num_iterations_per_epoch = DEMO_ITERATIONS
    trainer.num_val_iterations_per_epoch = DEMO_VAL_ITERATIONS


class nnUNetTrainerBaseline_demo(SeededTrainer):
    """Default nnU-Net (network, loss, SGD, augmentation) on the demo's short schedule, seeded as our trainers are
    (``SeededTrainer``: ``nnUNet_meddisseg_seed``), so that the demo gives the same table every time."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        demo_schedule(self)
