"""Default nnU-Net on the schedule of ``nnUNetTrainerMedDisSeg_smoke``: ``nnUNetv2_meddisseg_demo
--schedule smoke`` and the tests."""
import torch
from nnunetv2_meddisseg.training.base import SeededTrainer

__all__ = ["nnUNetTrainerBaseline_smoke"]


class nnUNetTrainerBaseline_smoke(SeededTrainer):
    """Default nnU-Net on the schedule of ``nnUNetTrainerMedDisSeg_smoke`` (3 epochs of 4 training and 2
    validation iterations), seeded as our trainers are (``SeededTrainer``)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = 3
        self.num_iterations_per_epoch = 4
        self.num_val_iterations_per_epoch = 2
