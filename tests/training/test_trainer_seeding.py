"""Per-epoch seeding of the trainers (``training.seeding.seed_epoch``) and the run seed's sources."""
import random

import numpy as np
import pytest
import torch
from test_trainer_meddisseg import make_trainer

from nnunetv2_meddisseg.environment import SEED_ENVIRONMENT_VARIABLE
from nnunetv2_meddisseg.training.seeding import run_seed_from_environment, seed_epoch


def draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_same_seed_and_epoch_give_the_same_numbers_whatever_was_drawn_before():
    seed_epoch(7, 3)
    first = draws()
    draws()  # an earlier epoch drawing more numbers must not matter
    seed_epoch(7, 3)
    assert draws() == first


@pytest.mark.parametrize("other", [(8, 3, 0), (7, 4, 0), (7, 3, 1)], ids=["seed", "epoch", "rank"])
def test_each_of_seed_epoch_and_rank_changes_every_generator(other):
    seed_epoch(7, 3, 0)
    base = draws()
    seed_epoch(*other)
    assert all(a != b for a, b in zip(base, draws()))


def test_run_seed_from_environment(monkeypatch):
    monkeypatch.delenv(SEED_ENVIRONMENT_VARIABLE, raising=False)
    assert run_seed_from_environment() is None
    monkeypatch.setenv(SEED_ENVIRONMENT_VARIABLE, " 42 ")
    assert run_seed_from_environment() == 42
    for bad in ("abc", "-1", "1.5"):
        monkeypatch.setenv(SEED_ENVIRONMENT_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"{SEED_ENVIRONMENT_VARIABLE} must be an integer >= 0, got '{bad}'"):
            run_seed_from_environment()


def test_preserved_random_state_leaves_the_streams_outside_untouched():
    from nnunetv2_meddisseg.training.seeding import preserved_random_state, seed_generators

    seed_epoch(7, 3)
    expected = draws()
    seed_epoch(7, 3)
    with preserved_random_state():
        seed_generators([1, 2])
        inside = draws()
    assert draws() == expected
    seed_generators([1, 2])
    assert draws() == inside


@pytest.mark.parametrize("trainer_name", ["nnUNetTrainerBaseline", "nnUNetTrainerBaseline_demo",
                                          "nnUNetTrainerBaseline_smoke"])
def test_the_baselines_are_seeded_like_our_trainers(nnunet_dirs, monkeypatch, trainer_name):
    """Default nnU-Net as the studies and the demo train it starts from the same weights and draws the same
    batches for the same run seed (nnU-Net's own trainer draws new ones every run)."""
    from nnunetv2_meddisseg.training import variants

    cls = getattr(variants, trainer_name)
    monkeypatch.setenv(SEED_ENVIRONMENT_VARIABLE, "5")
    first, second = make_trainer(cls), make_trainer(cls)
    for a, b in zip(first.network.state_dict().values(), second.network.state_dict().values()):
        assert torch.equal(a, b)
    numbers = []
    for trainer in (first, second):
        trainer.on_epoch_start()
        numbers.append(draws())
    assert numbers[0] == numbers[1]
    monkeypatch.setenv(SEED_ENVIRONMENT_VARIABLE, "6")
    other = make_trainer(cls)
    assert not torch.equal(next(iter(other.network.state_dict().values())),
                           next(iter(first.network.state_dict().values())))
