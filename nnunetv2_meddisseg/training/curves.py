"""Our per-epoch curves in nnU-Net's logger, and their plot.

nnU-Net's ``LocalLogger`` accepts a fixed set of keys (losses, pseudo Dice, one learning rate,
timestamps) and draws ``progress.png`` from them. Our trainers also track the learning rate of each
parameter group, the training stage, every loss term, each group's gradient norm and the dispersion
diagnostics. ``CurvesLogger`` is nnU-Net's ``LocalLogger`` accepting these keys too, so that they go
through ``MetaLogger.log`` like nnU-Net's own values: into every logger nnU-Net drives (Weights &
Biases with ``nnUNet_wandb_enabled=1``) and into the ``logging`` entry of the checkpoints.
``TrainingCurves`` reads and draws them into a second figure, ``progress_terms.png``, beside
``progress.png`` (which stays untouched).
"""
import math
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from nnunetv2.training.logging.nnunet_logger import LocalLogger

__all__ = ["TrainingCurves", "CurvesLogger", "NNUNET_KEYS", "PLOT_FILENAME"]

PLOT_FILENAME = "progress_terms.png"
#: the keys nnU-Net's ``LocalLogger`` knows; every other key is one of our curves
NNUNET_KEYS = tuple(LocalLogger().my_fantastic_logging)
_PLOT_STYLE = {"font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9,
               "ytick.labelsize": 9, "legend.fontsize": 8, "figure.titlesize": 12, "lines.linewidth": 1.5,
               "lines.markersize": 5}


class TrainingCurves:
    """One float per epoch for any number of named curves.

    ``log(key, value, epoch)`` sets the value of ``key`` at ``epoch``; epochs a curve skipped are NaN
    (e.g. Stage II loss terms during Stage I). Key prefixes decide the panel of the plot: ``loss_``
    (loss terms), ``lr_`` (learning rates, log scale), ``dispersion_`` (diagnostics), ``stage``.
    """

    def __init__(self, values: Optional[Dict[str, List[float]]] = None) -> None:
        #: the curves by key (``values`` itself where given: the curves are a view on it)
        self.values: Dict[str, List[float]] = values if values is not None else {}

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
        return sorted(k for k in self.values if k.startswith(prefix) and k not in NNUNET_KEYS)

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


class CurvesLogger(LocalLogger):
    """nnU-Net's ``LocalLogger`` that also accepts keys of its own (floats, one per epoch).

    A key first logged at a later epoch gets NaN for the epochs before; ``fill_missing`` gives every
    such curve NaN at an epoch where nothing was logged, so that each list holds one entry per epoch
    (nnU-Net's ``plot_progress_png`` draws as many epochs as its shortest list). A value logged again
    for its epoch replaces the earlier one.
    """

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

    def adopt(self, curves: Mapping[str, Sequence[float]]) -> None:
        """Take ``curves`` (key -> one float per epoch, e.g. a ``training_curves`` checkpoint entry) for the
        keys this logger lacks, cut or padded with NaN to the epochs it holds (``epoch_end_timestamps``)."""
        epochs = len(self.my_fantastic_logging["epoch_end_timestamps"])
        for key, curve in curves.items():
            if key not in self.my_fantastic_logging:
                values = [float(v) for v in curve][:epochs]
                self.my_fantastic_logging[key] = values + [math.nan] * (epochs - len(values))

    def curves(self) -> TrainingCurves:
        """Our curves (every key but nnU-Net's), a view that follows later logging."""
        return TrainingCurves(self.my_fantastic_logging)
