"""The budgets of ``benchmarks/quality.py``'s runs: the same training iterations, images or minutes, turned into
the iterations per epoch of each method's runs."""
import argparse
import math
from typing import NamedTuple, Optional

import numpy as np

from nnunetv2_meddisseg.errors import UserError


class Budget(NamedTuple):
    """The same training iterations at ``batch`` (``iterations``), training images (``images``, each
    method at its plans' batch) or training minutes (``minutes``: the sum of nnU-Net's epoch durations)."""

    kind: str
    amount: float
    batch: Optional[int] = None  #: ``iterations`` only

    @property
    def label(self) -> str:
        return f"{self.kind}{self.amount:g}" + (f"_bs{self.batch}" if self.batch else "")

    def describe(self) -> str:
        if self.kind == "iterations":
            return f"{self.amount:g} training iterations per run at batch {self.batch}"
        return f"{self.amount:g} training {self.kind} per run, each method at its plans' batch"


def parse_budget(text: str) -> Budget:
    kind, _, amount = text.partition(":")
    try:
        value = float(amount)
    except ValueError:
        value = math.nan
    if kind not in ("iterations", "images", "minutes") or not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected iterations:N, images:N or minutes:M with a number above 0, "
                                         f"got {text!r}")
    return Budget(kind, value)


def iterations_per_epoch(budget: Budget, epochs: int, batch: int, calibration: Optional[dict] = None) -> int:
    """Training iterations per epoch that spend ``budget`` in ``epochs`` epochs at ``batch``.

    ``calibration`` (``minutes`` only): a finished run of the same method and ``epochs`` on the same device,
    ``{"epoch_seconds": [...], "iterations_per_epoch": n}``. Epoch durations above their median count as
    one-off overhead (compilation, the first epoch after a resume); the rest scales with the iterations."""
    if budget.kind == "iterations":
        return max(1, round(budget.amount / epochs))
    if budget.kind == "images":
        return max(1, math.ceil(budget.amount / (batch * epochs)))
    seconds = calibration["epoch_seconds"]
    median = float(np.median(seconds))
    overhead = sum(max(0.0, s - median) for s in seconds)
    iterations = math.floor(calibration["iterations_per_epoch"] * (60 * budget.amount - overhead)
                            / (sum(seconds) - overhead))
    if iterations < 1:
        raise UserError(f"--budget {budget.kind}:{budget.amount:g} is too small: the calibration run spent "
                        f"{overhead:.0f} s on overhead and {sum(seconds) - overhead:.0f} s on "
                        f"{calibration['iterations_per_epoch']} iterations per epoch")
    return iterations
