"""Per-epoch curves that nnU-Net's logger has no place for, and their plot.

nnU-Net's ``LocalLogger`` accepts a fixed set of keys (losses, pseudo Dice, one learning rate,
timestamps) and draws ``progress.png`` from them. Our trainers also track the learning rate of each
parameter group, the training stage, every loss term and the dispersion diagnostics; they live here,
are stored in the checkpoints next to nnU-Net's logging state and are drawn into a second figure,
``progress_terms.png``, beside ``progress.png`` (which stays untouched).
"""
import math
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["TrainingCurves", "PLOT_FILENAME"]

PLOT_FILENAME = "progress_terms.png"
_PLOT_STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9,
               "ytick.labelsize": 9, "legend.fontsize": 8, "figure.titlesize": 12, "lines.linewidth": 1.5,
               "lines.markersize": 5}


class TrainingCurves:
    """One float per epoch for any number of named curves.

    ``log(key, value, epoch)`` sets the value of ``key`` at ``epoch``; epochs a curve skipped are NaN
    (e.g. Stage II loss terms during Stage I). Key prefixes decide the panel of the plot: ``loss_``
    (loss terms), ``lr_`` (learning rates, log scale), ``dispersion_`` (diagnostics), ``stage``.
    """

    def __init__(self) -> None:
        self.values: Dict[str, List[float]] = {}

    def log(self, key: str, value: float, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"TrainingCurves.log: epoch must be >= 0, got {epoch}")
        curve = self.values.setdefault(key, [])
        while len(curve) <= epoch:
            curve.append(math.nan)
        curve[epoch] = float(value)

    def log_many(self, values: Mapping[str, float], epoch: int) -> None:
        for key, value in values.items():
            self.log(key, value, epoch)

    def get(self, key: str, epoch: Optional[int] = None):
        """The whole curve (``epoch=None``) or its value at ``epoch`` (NaN where nothing was logged)."""
        curve = self.values.get(key, [])
        if epoch is None:
            return list(curve)
        return curve[epoch] if 0 <= epoch < len(curve) else math.nan

    def keys(self, prefix: str = "") -> List[str]:
        return sorted(k for k in self.values if k.startswith(prefix))

    def get_checkpoint(self) -> Dict[str, List[float]]:
        return {key: list(curve) for key, curve in self.values.items()}

    def load_checkpoint(self, checkpoint: Optional[Mapping[str, Sequence[float]]]) -> None:
        self.values = {key: [float(v) for v in curve] for key, curve in (checkpoint or {}).items()}

    def plot(self, filename: str, num_epochs: Optional[int] = None, stage_boundaries: Iterable[int] = ()) -> None:
        """Draw loss terms, learning rates and dispersion diagnostics over the epochs into ``filename``.

        ``num_epochs``: how many epochs to draw (default: the longest curve). ``stage_boundaries``:
        epochs at which a new training stage starts (dashed vertical lines).
        """
        with matplotlib.rc_context(_PLOT_STYLE):  # nnU-Net's progress plot scales all fonts globally
            self._draw(filename, num_epochs, stage_boundaries)

    def _draw(self, filename: str, num_epochs: Optional[int], stage_boundaries: Iterable[int]) -> None:
        length = num_epochs if num_epochs is not None else max((len(c) for c in self.values.values()), default=0)
        epochs = list(range(length))

        def series(key: str) -> List[float]:
            curve = self.values.get(key, [])[:length]
            return curve + [math.nan] * (length - len(curve))

        figure = Figure(figsize=(12, 13), dpi=80)
        FigureCanvasAgg(figure)
        ax_loss, ax_lr, ax_disp = figure.subplots(3, 1, sharex=True)

        for key in self.keys("loss_"):
            ax_loss.plot(epochs, series(key), marker=".", label=key[len("loss_"):])
        ax_loss.set_ylabel("training loss term (unweighted)")

        for key in self.keys("lr_"):
            ax_lr.plot(epochs, series(key), marker=".", label=key[len("lr_"):])
        if any(v > 0 for key in self.keys("lr_") for v in series(key) if not math.isnan(v)):
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
        folder = os.path.dirname(os.path.abspath(filename))
        temporary = os.path.join(folder, f".{os.path.basename(filename)}.{os.getpid()}.tmp.png")
        figure.savefig(temporary)
        os.replace(temporary, filename)
