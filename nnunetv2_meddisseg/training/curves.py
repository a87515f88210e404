"""Our per-epoch curves in nnU-Net's logger, and their plot.

``CurvesLogger`` is nnU-Net's ``LocalLogger`` also accepting our keys (each group's learning rate and gradient norm,
the stage, every loss term, dispersion diagnostics), so ``MetaLogger.log`` takes them to every logger nnU-Net drives
(Weights & Biases with ``nnUNet_wandb_enabled=1``) and to the checkpoints' ``logging`` entry. ``plot_curves`` draws
them into ``progress_terms.png``; ``progress.png`` stays untouched.
"""
import math
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from nnunetv2.training.logging.nnunet_logger import LocalLogger

from nnunetv2_meddisseg.files import write_atomically

__all__ = ["CurvesLogger", "plot_curves", "epoch_means", "summary_lines", "stopped_learning", "CURVE_PREFIXES",
           "NNUNET_KEYS", "PLOT_FILENAME"]

PLOT_FILENAME = "progress_terms.png"
#: the keys nnU-Net's ``LocalLogger`` knows; every other key is one of our curves
NNUNET_KEYS = tuple(LocalLogger().my_fantastic_logging)
#: (``train_step`` key prefix, title, number format) of each log summary line; these prefixes' keys are our curves
SUMMARY_SECTIONS = (("loss_", "loss terms", ".4f"), ("grad_norm_", "gradient norms (before clipping)", ".4g"),
                    ("dispersion_", "dispersion", ".4g"))
CURVE_PREFIXES = tuple(prefix for prefix, _, _ in SUMMARY_SECTIONS)
_PLOT_STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9,
               "ytick.labelsize": 9, "legend.fontsize": 8, "figure.titlesize": 12, "lines.linewidth": 1.5,
               "lines.markersize": 5}


def epoch_means(outputs: Mapping[str, Sequence[float]]) -> Dict[str, float]:
    """Per ``CURVE_PREFIXES`` key of the collated ``train_step`` ``outputs``: the mean of its finite values, or NaN."""
    finite = {key: [v for v in values if np.isfinite(v)] for key, values in outputs.items()
              if key.startswith(CURVE_PREFIXES)}
    return {key: float(np.mean(values)) if values else float("nan") for key, values in finite.items()}


def summary_lines(means: Mapping[str, float]) -> List[str]:
    """The epoch's log lines, one per ``SUMMARY_SECTIONS`` section with values (``loss terms: seg 0.4012, ...``)."""
    lines = []
    for prefix, title, number in SUMMARY_SECTIONS:
        values = sorted((k[len(prefix):], v) for k, v in means.items() if k.startswith(prefix))
        if values:
            lines.append(f"{title}: " + ", ".join(f"{name} {value:{number}}" for name, value in values))
    return lines


def stopped_learning(outputs: Mapping[str, Sequence[float]]) -> bool:
    """True where no step had a finite, non-zero ``grad_norm_*`` in the collated ``train_step`` ``outputs`` (False
    without such keys), e.g. under fp16 once the GradScaler has shrunk its scale until every gradient underflows."""
    norms = [np.asarray(v, dtype=np.float64).reshape(-1) for k, v in outputs.items() if k.startswith("grad_norm_")]
    if not norms:
        return False
    norms = np.concatenate(norms)
    return not np.any(np.isfinite(norms) & (norms > 0))


def _our_keys(curves: Mapping[str, Sequence[float]], prefix: str) -> List[str]:
    """Our curves' keys (every key but nnU-Net's) that start with ``prefix``, sorted."""
    return sorted(k for k in curves if k.startswith(prefix) and k not in NNUNET_KEYS)


def plot_curves(curves: Mapping[str, Sequence[float]], filename: str, num_epochs: Optional[int] = None,
                stage_boundaries: Iterable[int] = ()) -> None:
    """Draw the ``loss_``, ``lr_`` (log scale) and ``dispersion_`` curves per epoch into the PNG ``filename``.
    curves: key -> one float per epoch, NaN where none was logged; nnU-Net's keys are left out. ``num_epochs``: default
    the longest curve. ``stage_boundaries``: epochs that start a new stage (dashed lines). The file is written whole."""
    with matplotlib.rc_context(_PLOT_STYLE):  # nnU-Net's progress plot scales all fonts globally
        figure = _figure(curves, num_epochs, stage_boundaries)
        write_atomically(Path(filename), lambda partial: figure.savefig(partial, format="png"))


def _figure(curves: Mapping[str, Sequence[float]], num_epochs: Optional[int], stage_boundaries: Iterable[int]):
    length = num_epochs if num_epochs is not None else max((len(c) for c in curves.values()), default=0)
    epochs = list(range(length))

    def series(key: str) -> List[float]:
        curve = list(curves.get(key, []))[:length]
        return curve + [math.nan] * (length - len(curve))

    figure = Figure(figsize=(12, 13), dpi=80)
    FigureCanvasAgg(figure)
    ax_loss, ax_lr, ax_disp = figure.subplots(3, 1, sharex=True)

    for ax, prefix in ((ax_loss, "loss_"), (ax_lr, "lr_")):
        for key in _our_keys(curves, prefix):
            ax.plot(epochs, series(key), marker=".", label=key[len(prefix):])
    ax_loss.set_ylabel("training loss term (unweighted)")
    if any(v > 0 for key in _our_keys(curves, "lr_") for v in series(key) if not math.isnan(v)):
        ax_lr.set_yscale("log")
    ax_lr.set_ylabel("learning rate")

    distance_key, rank_key = "dispersion_mean_pairwise_distance", "dispersion_effective_rank"
    ax_disp.plot(epochs, series(distance_key), color="tab:blue", marker=".", label="mean pairwise d_ij")
    ax_disp.set_ylabel("mean pairwise d_ij", color="tab:blue")
    ax_rank = ax_disp.twinx()
    ax_rank.plot(epochs, series(rank_key), color="tab:red", marker=".", label="effective rank")
    ax_rank.set_ylabel("effective rank", color="tab:red")
    ax_disp.set_xlabel("epoch")

    for ax in (ax_loss, ax_lr, ax_disp):
        for boundary in stage_boundaries:
            if 0 < boundary < max(length, 1):
                ax.axvline(boundary - 0.5, color="gray", linestyle="--", linewidth=1)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize="small")
        ax.grid(True, alpha=0.3)
    figure.suptitle("loss terms, learning rates and feature dispersion per epoch")
    figure.tight_layout()
    return figure


class CurvesLogger(LocalLogger):
    """nnU-Net's ``LocalLogger`` that also accepts keys of ours (floats, one per epoch). A key first logged later gets
    NaN for the epochs before; logging an epoch again replaces its value. ``fill_missing`` keeps one entry per epoch in
    every list: nnU-Net's ``plot_progress_png`` draws as many epochs as its shortest list."""

    def log(self, key, value, epoch: int):
        logged = self.my_fantastic_logging
        if key not in NNUNET_KEYS:
            if epoch < 0:
                raise ValueError(f"CurvesLogger.log: epoch must be >= 0, got {epoch}")
            value = float(value)
            curve = logged.setdefault(key, [])
            curve.extend([math.nan] * (epoch - len(curve)))
        if key in logged and len(logged[key]) == epoch + 1:
            logged[key][epoch] = value
            return
        super().log(key, value, epoch)

    def fill_missing(self, epoch: int) -> None:
        """NaN at ``epoch`` (and any epoch before it) for every curve of ours that lacks a value there."""
        for key, curve in self.my_fantastic_logging.items():
            if key not in NNUNET_KEYS:
                curve.extend([math.nan] * (epoch + 1 - len(curve)))
