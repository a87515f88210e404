"""The paper's segmentation metrics as pure functions on numpy label maps.

Binary (Kvasir-SEG, Kvasir-Sessile, GlaS, ISIC): per image as the paper and its released code compute them, then the
mean over images; with P the predicted and G the reference foreground, I = |P and G|, U = |P or G|, e = 1e-15::

    IoU = (I + e) / (U + e)              Dice = (2I + e) / (|P| + |G| + e)
    Recall = (I + e) / (|G| + e)         Precision = (I + e) / (|P| + e)

An empty prediction scores 1 everywhere on an empty reference, and 0 IoU/Dice/Recall but precision 1 on a non-empty one.

Multi-class (Synapse, TransUNet protocol): per volume and organ, Dice and HD95 of the organ's binary masks, with
TransUNet's empty-mask rule (``calculate_metric_percase``): both non-empty give (2|P and G| / (|P| + |G|), HD95), a
prediction on an empty reference (1, 0), an empty prediction (0, 0). Every organ of every volume counts (none is skipped
as NaN): a missed organ scores HD95 0. Per organ the mean over volumes; the reported mean is over organs.

HD95 (medpy's ``hd95``): the larger of the two directed 95th percentiles of the distances between the surface voxels
(``surface_voxels``) of prediction and reference; in voxels as TransUNet's (no spacing), else in ``spacing``'s units.
"""
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

__all__ = [
    "EPSILON",
    "BINARY_METRICS",
    "binary_metrics",
    "surface_voxels",
    "directed_surface_distances",
    "hd95",
    "dice_hd95_transunet",
    "multiclass_dice_hd95",
    "mean_and_std",
]

EPSILON = 1e-15
BINARY_METRICS = ("iou", "dice", "recall", "precision")


def binary_metrics(prediction: np.ndarray, reference: np.ndarray, eps: float = EPSILON) -> Dict[str, float]:
    """IoU, Dice, recall and precision of one image, fractions in [0, 1]; any dimensions, nonzero = foreground."""
    if prediction.shape != reference.shape:
        raise ValueError(f"prediction shape {prediction.shape} differs from reference shape {reference.shape}")
    p = prediction != 0
    g = reference != 0
    inter = float(np.count_nonzero(p & g))
    n_p = float(np.count_nonzero(p))
    n_g = float(np.count_nonzero(g))
    union = n_p + n_g - inter
    return {
        "iou": (inter + eps) / (union + eps),
        "dice": (2.0 * inter + eps) / (n_p + n_g + eps),
        "recall": (inter + eps) / (n_g + eps),
        "precision": (inter + eps) / (n_p + eps),
    }


def surface_voxels(mask: np.ndarray) -> np.ndarray:
    """Boolean map of the foreground voxels that one erosion removes (face connectivity; outside = background)."""
    mask = np.asarray(mask, dtype=bool)
    structure = ndimage.generate_binary_structure(mask.ndim, 1)
    return mask & ~ndimage.binary_erosion(mask, structure=structure, iterations=1, border_value=0)


def _crop_to_union(a: np.ndarray, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Crop both masks to the bounding box of their union plus one voxel (clipped to the array)."""
    coords = np.argwhere(a | b)
    lo = np.maximum(coords.min(0) - 1, 0)
    hi = np.minimum(coords.max(0) + 2, a.shape)
    sl = tuple(slice(int(l), int(h)) for l, h in zip(lo, hi))
    return a[sl], b[sl]


def directed_surface_distances(source: np.ndarray, target: np.ndarray,
                               spacing: Optional[Sequence[float]] = None) -> np.ndarray:
    """1D distances from each surface voxel of ``source`` to the nearest of ``target`` (same shape, both non-empty)."""
    source = np.asarray(source, dtype=bool)
    target = np.asarray(target, dtype=bool)
    if source.shape != target.shape:
        raise ValueError(f"mask shapes differ: {source.shape} vs {target.shape}")
    if not source.any() or not target.any():
        raise ValueError("surface distances need two non-empty masks")
    # the surfaces (and hence all distances) only depend on the union's bounding box plus one voxel
    source, target = _crop_to_union(source, target)
    dist_to_target = ndimage.distance_transform_edt(~surface_voxels(target), sampling=spacing)
    return dist_to_target[surface_voxels(source)]


def hd95(prediction: np.ndarray, reference: np.ndarray, spacing: Optional[Sequence[float]] = None) -> float:
    """95th-percentile Hausdorff distance of two non-empty masks (medpy's); ``spacing`` default 1 = voxel units."""
    d_pr = directed_surface_distances(prediction, reference, spacing)
    d_rp = directed_surface_distances(reference, prediction, spacing)
    return float(max(np.percentile(d_pr, 95), np.percentile(d_rp, 95)))


def dice_hd95_transunet(prediction: np.ndarray, reference: np.ndarray,
                        spacing: Optional[Sequence[float]] = None) -> Tuple[float, float]:
    """(Dice, HD95) of one organ in one volume with TransUNet's empty-mask rule; nonzero = organ."""
    if prediction.shape != reference.shape:
        raise ValueError(f"prediction shape {prediction.shape} differs from reference shape {reference.shape}")
    p = prediction != 0
    g = reference != 0
    n_p = int(np.count_nonzero(p))
    n_g = int(np.count_nonzero(g))
    if n_p > 0 and n_g > 0:
        dice = 2.0 * float(np.count_nonzero(p & g)) / float(n_p + n_g)
        return dice, hd95(p, g, spacing)
    if n_p > 0:
        return 1.0, 0.0
    return 0.0, 0.0


def multiclass_dice_hd95(prediction: np.ndarray, reference: np.ndarray, labels: Iterable[int],
                         spacing: Optional[Sequence[float]] = None) -> Dict[int, Dict[str, float]]:
    """``{label: {"dice", "hd95"}}`` of one volume (TransUNet protocol) for the foreground values ``labels``."""
    scores = {int(label): dice_hd95_transunet(prediction == label, reference == label, spacing) for label in labels}
    return {label: {"dice": dice, "hd95": hd} for label, (dice, hd) in scores.items()}


def mean_and_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) of a list of scores."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    std = float(np.std(arr, ddof=1)) if arr.size > 1 else 0.0
    return float(np.mean(arr)), std

