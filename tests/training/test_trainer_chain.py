"""The trainers' class chain: nnU-Net's trainer, one base, ours; each of nnU-Net's hooks overridden at most once."""
import pytest
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.trainer_base import TrainerBase

#: nnU-Net's methods and properties (the constructor aside: every class of the chain has its own)
NNUNET_HOOKS = {name for name, value in vars(nnUNetTrainer).items()
                if name != "__init__" and (callable(value) or isinstance(value, (staticmethod, classmethod, property)))}


@pytest.mark.parametrize("trainer", [nnUNetTrainerMedDisSeg, nnUNetTrainerDispersive])
def test_three_classes_and_no_nnunet_hook_overridden_twice(trainer):
    chain = [c for c in trainer.__mro__ if issubclass(c, nnUNetTrainer)]
    assert chain == [trainer, TrainerBase, nnUNetTrainer]
    twice = NNUNET_HOOKS & set(vars(TrainerBase)) & set(vars(trainer))
    assert not twice, f"{trainer.__name__} and TrainerBase both override {sorted(twice)}"


def test_the_hooks_are_found():  # the test above would pass vacuously on an empty set
    assert {"train_step", "validation_step", "on_train_start", "perform_actual_validation"} <= NNUNET_HOOKS
