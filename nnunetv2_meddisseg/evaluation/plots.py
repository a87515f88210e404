"""Figures of the comparison, written as PNG with matplotlib's Agg backend: a bar chart and per-case overlays."""
import itertools
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from nnunetv2_meddisseg.evaluation.metrics import surface_voxels  # noqa: E402

__all__ = ["bar_chart", "display_image", "label_overlay", "most_different_slice", "overlay_figure"]


def bar_chart(rows: Sequence[Mapping], metrics: Sequence[str], out_file: str, title: str = "",
              ylabel: str = "score (%)", metric_labels: Optional[Mapping[str, str]] = None) -> None:
    """Grouped bars, one group per metric, one bar per row, std error bars where given; ``rows``: ``[{"name",
    "values": {metric: float or None}, "std": {...}}, ...]``, a missing or None value leaving a gap."""
    metric_labels = dict(metric_labels or {})
    n_rows = max(len(rows), 1)
    x = np.arange(len(metrics), dtype=float)
    width = 0.8 / n_rows
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(metrics) + 2.0), 4.0))
    colors = plt.get_cmap("tab10").colors
    top = 0.0
    for i, row in enumerate(rows):
        errs = [(row.get("std") or {}).get(m) for m in metrics]
        heights = np.array([row["values"].get(m) for m in metrics], dtype=float)  # None -> NaN
        yerr = np.array([0.0 if e is None else e for e in errs], dtype=float)
        has_err = any(e is not None for e in errs)
        offset = (i - (n_rows - 1) / 2.0) * width
        bars = ax.bar(x + offset, np.nan_to_num(heights), width, label=row["name"], color=colors[i % len(colors)],
                      yerr=yerr if has_err else None, capsize=3 if has_err else 0, ecolor="0.3")
        for b, h, e in zip(bars, heights, yerr):
            if np.isnan(h):
                b.set_visible(False)
            else:
                ax.annotate(f"{h:.1f}", (b.get_x() + b.get_width() / 2, h + e), ha="center", va="bottom",
                            fontsize=7, xytext=(0, 1), textcoords="offset points")
        top = max([top, *np.nan_to_num(heights + yerr).tolist()])  # a gap (NaN) counts as 0
    ax.set_xticks(x)
    ax.set_xticklabels([metric_labels.get(m, m) for m in metrics], rotation=30 if len(metrics) > 6 else 0,
                       ha="right" if len(metrics) > 6 else "center")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, max(top * 1.12, 1.0))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(metrics) <= 6 else -0.3),
              ncol=min(n_rows, 3), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_file, dpi=120)
    plt.close(fig)


def display_image(image: Optional[np.ndarray], shape: Sequence[int]) -> np.ndarray:
    """An (H, W, 3) float image in [0, 1] for display from (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) (RGB(A) in
    0..255 or 0..1; one channel is windowed to its 0.5-99.5th percentiles), or None for grey of ``shape``."""
    if image is None:
        return np.full((*shape, 3), 0.5, dtype=np.float32)
    img = np.asarray(image, dtype=np.float32)
    if img.ndim == 3 and img.shape[-1] in (3, 4):
        rgb = img[..., :3]
        return np.clip(rgb / 255.0 if rgb.max() > 1.0 else rgb, 0.0, 1.0)
    if img.ndim == 3:
        img = img[..., 0]
    lo, hi = np.percentile(img, [0.5, 99.5])
    gray = np.clip((img - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros_like(img)
    return np.repeat(gray[..., None], 3, axis=-1)


def label_overlay(background: np.ndarray, labels: np.ndarray, alpha: float = 0.45) -> np.ndarray:
    """Blend a label map onto an (H, W, 3) image and outline each label; label 1 is red, then tab10's colours."""
    out = background.copy()
    colors = np.array(plt.get_cmap("tab10").colors, dtype=np.float32)
    palette = np.concatenate([colors[3:4], colors[:3], colors[4:]])  # label 1 in red
    for k in np.unique(labels[labels != 0]):
        m = labels == k
        color = palette[(int(k) - 1) % len(palette)]
        out[m] = (1.0 - alpha) * out[m] + alpha * color
        out[surface_voxels(m)] = color
    return out


def most_different_slice(reference: np.ndarray, predictions: Sequence[np.ndarray]) -> int:
    """Index along axis 0 of a volume where the predictions disagree most (ties: most reference foreground)."""
    per_slice = tuple(range(1, reference.ndim))
    disagreement = np.zeros(reference.shape[0], dtype=np.int64)
    for a, b in itertools.combinations(predictions, 2):
        disagreement += np.count_nonzero(a != b, axis=per_slice)
    order = np.lexsort((np.count_nonzero(reference, axis=per_slice), disagreement))  # last key is primary
    return int(order[-1])


def overlay_figure(image: Optional[np.ndarray], reference: np.ndarray, predictions: Sequence[np.ndarray],
                   names: Sequence[str], out_file: str, title: str = "",
                   scores: Optional[Sequence[Optional[float]]] = None, score_name: str = "Dice") -> None:
    """Panels image | ground truth | one per prediction: image (H, W[, C]) or None, label maps (H, W), ``scores``
    one per prediction (fractions, shown in percent)."""
    bg = display_image(image, reference.shape)
    n = 2 + len(predictions)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n, 2.9))
    panels = [(bg, "image"), (label_overlay(bg, reference), "ground truth")]
    for i, (p, name) in enumerate(zip(predictions, names)):
        s = None if scores is None else scores[i]
        panels.append((label_overlay(bg, p), name if s is None else f"{name}\n{score_name} {100 * s:.1f}%"))
    for ax, (img, t) in zip(axes, panels):
        ax.imshow(img, interpolation="nearest")
        ax.set_title(t, fontsize=9)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_file, dpi=100)
    plt.close(fig)
