"""Med-DisSeg on the short schedule of ``nnUNetv2_meddisseg_demo`` (the same iterations as
``nnUNetTrainerBaseline_demo``)."""
import torch

from nnunetv2_meddisseg.training.nnUNetTrainerBaseline_demo import demo_schedule
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

__all__ = ["nnUNetTrainerMedDisSeg_demo"]


class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg):
    """Med-DisSeg on the demo's short schedule (the first quarter of the epochs is Stage I)."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        demo_schedule(self)
