"""What our trainers report about the dispersive loss: diagnostics on each epoch's first batch, and too-small batches.

``EpochDiagnostics`` gives a ``train_step`` result its ``dispersion_*`` entries: ``dispersion_diagnostics`` of the
first regularised layer (over the batch the loss disperses) on an epoch's first step, NaN on the others (the curve
is the mean of the finite values), so their cost is paid once per epoch. ``small_batch_warning`` is a start-up log
line where the dispersive form needs more samples than one loss sees (``losses.MINIMUM_BATCH``);
``SINGLE_SAMPLE_WARNING`` where a training batch holds one.
"""
import math
from typing import Dict, Optional

from torch import Tensor

from nnunetv2_meddisseg.losses import DIAGNOSTIC_KEYS, MINIMUM_BATCH, DispersiveLoss, dispersion_diagnostics

__all__ = ["EpochDiagnostics", "small_batch_warning", "SINGLE_SAMPLE_WARNING"]

SINGLE_SAMPLE_WARNING = ("WARNING: a training batch holds a single sample: the dispersive loss needs at least two "
                         "samples and is zero for such batches. Use a batch size >= 2 in the plans to get dispersion "
                         "regularisation.")


class EpochDiagnostics:
    """The dispersion diagnostics of each epoch's first training step, over the batch ``dispersive`` disperses."""

    def __init__(self, dispersive: DispersiveLoss):
        self.dispersive = dispersive
        self.due = True

    def new_epoch(self) -> None:
        self.due = True

    def __call__(self, features: Tensor) -> Dict[str, float]:
        """features: (B_r, ...) of this process -> ``{"dispersion_<key>": value}``."""
        if not self.due:
            return {f"dispersion_{k}": math.nan for k in DIAGNOSTIC_KEYS}
        self.due = False
        batch = self.dispersive.batch(features.detach())
        return {f"dispersion_{k}": v for k, v in dispersion_diagnostics(batch).items()}


def small_batch_warning(variant: str, samples: int, per_process: bool = False, world_size: int = 1) -> Optional[str]:
    """One line for the log where the dispersive form ``variant`` needs more than the ``samples`` one loss sees
    (``per_process``: each process's share, the batch is not gathered), else None."""
    needed = MINIMUM_BATCH.get(variant, 2)
    if samples >= needed:
        return None
    where = " per process (dispersive_gather is off)" if per_process else ""
    plans_batch = needed * (world_size if per_process else 1)
    other_form = (", or the infonce_cosine form (nnUNetTrainerDispersive_cosine)"
                  if variant == "infonce_cosine_centred" else "")
    return (f"WARNING: the dispersive loss ({variant}) sees {samples} sample(s) per step{where} but needs at least "
            f"{needed}: it is a constant without gradient and does not regularise. Use a batch size >= {plans_batch} "
            f"in the plans{other_form}.")
