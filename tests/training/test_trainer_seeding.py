"""Per-epoch seeding of the trainers (``training.base.seed_epoch``) and the run seed's sources."""
import random

import numpy as np
import pytest
import torch

from nnunetv2_meddisseg.training.base import SEED_ENVIRONMENT_VARIABLE, run_seed_from_environment, seed_epoch


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
