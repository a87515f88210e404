"""The run seed and the seeding of Python's, NumPy's and torch's global random generators.

The run seed is a trainer's ``seed``, else ``nnUNet_meddisseg_seed``, else random. ``seed_epoch`` seeds from
``(run seed, epoch, rank)``, so an epoch is a function of the weights and optimizer state it starts from, and ``--c``
replays the rest of an interrupted run where the arithmetic is deterministic.
"""
import os
import random
from contextlib import contextmanager
from typing import Optional, Sequence

import numpy as np
import torch

from nnunetv2_meddisseg.environment import SEED_ENVIRONMENT_VARIABLE
from nnunetv2_meddisseg.training.errors import TrainingInputError

__all__ = ["SEED_ENVIRONMENT_VARIABLE", "run_seed_from_environment", "seed_epoch", "seed_generators",
           "preserved_random_state"]


def run_seed_from_environment() -> Optional[int]:
    """The integer >= 0 in ``nnUNet_meddisseg_seed``, None if unset or empty; anything else: ``TrainingInputError``."""
    value = os.environ.get(SEED_ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return None
    try:
        seed = int(value)
    except ValueError:
        seed = -1
    if seed < 0:
        raise TrainingInputError(f"{SEED_ENVIRONMENT_VARIABLE} must be an integer >= 0, got {value!r}")
    return seed


def seed_epoch(run_seed: int, epoch: Optional[int], rank: int = 0) -> None:
    """Seed ``random``, ``numpy.random`` and torch (CPU and CUDA) from ``(run_seed, epoch, rank)``; ``epoch`` None
    seeds the initialisation (weights, heads). Streams are independent per epoch and rank, so no epoch's random
    numbers depend on how many an earlier one drew."""
    seed_generators([run_seed, 0, rank] if epoch is None else [run_seed, 1, epoch, rank])


def seed_generators(stream: Sequence[int]) -> None:
    """Seed ``random``, ``numpy.random`` and torch (CPU and CUDA) from ``stream``, independently per stream."""
    words = np.random.SeedSequence(list(stream)).generate_state(4, dtype=np.uint32)
    random.seed(int(words[0]))
    np.random.seed(int(words[1]))
    torch.manual_seed((int(words[2]) << 32) | int(words[3]))


@contextmanager
def preserved_random_state():
    """Run a block without shifting the streams of ``random``, ``numpy.random`` and torch's CPU generator outside it."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
