"""Med-DisSeg on the short schedule of ``nnUNetv2_meddisseg_demo`` (the same iterations as
``nnUNetTrainerBaseline_demo``), with settings for a network that starts from random initialisation."""
import torch

from nnunetv2_meddisseg.training.nnUNetTrainerBaseline_demo import demo_schedule
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.scratch_variants import SCRATCH_ADAM

__all__ = ["nnUNetTrainerMedDisSeg_demo"]


class nnUNetTrainerMedDisSeg_demo(nnUNetTrainerMedDisSeg):
    """Med-DisSeg on the demo's short schedule (the first quarter of the epochs is Stage I).

    The demo trains from random initialisation for 120 iterations, where the paper's rates (Adam 1e-4,
    encoder 1e-5, meant for an ImageNet encoder) barely move the network: Adam at 1e-3 for every group
    (``SCRATCH_ADAM``) instead, chosen on the demo's validation cases. BatchNorm statistics are
    re-estimated over 16 training samples (the generated dataset has 19 training cases), without
    augmentation."""

    scratch_settings = SCRATCH_ADAM
    batchnorm_calibration_samples = 16
    batchnorm_calibration_augmentation = False

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        demo_schedule(self)
