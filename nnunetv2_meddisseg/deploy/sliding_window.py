"""nnU-Net's Gaussian-weighted sliding window over the runtimes' sessions, in numpy.

As ``nnUNetPredictor``: the same tiles (the image padded around its centre to at least the patch), Gaussian map
(sigma = patch / 8, zeros replaced by its smallest non-zero value), mirroring (mean over every combination of the
mirror axes) and fold mean; map, sums and mean in float16 as nnU-Net's, since where two classes' logits nearly tie
the rounding decides the label. Tiles go to a session in stacks of up to ``MAX_BATCH``; the logits must have the
described shape (numpy would broadcast a single class over all of them).
"""
from __future__ import annotations

import functools
import itertools
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from scipy.ndimage import gaussian_filter

from nnunetv2_meddisseg.errors import UserError

__all__ = ["MAX_BATCH", "tile_starts", "gaussian_importance", "pad_to_patch", "mirror_combinations",
           "sliding_window_logits", "sliding_window_logits_of_cases"]

#: most network inputs (tiles times their mirrored copies) handed to a session in one call
MAX_BATCH = 32


def tile_starts(image_size: Sequence[int], patch_size: Sequence[int], step: float) -> List[List[int]]:
    """Tile start positions per axis: as few tiles as keep consecutive starts at most ``step * patch`` apart,
    spread evenly from 0 to ``image - patch``. image_size >= patch_size on every axis."""
    starts = []
    for image, patch in zip(image_size, patch_size):
        count = int(np.ceil((image - patch) / (patch * step))) + 1
        stride = (image - patch) / (count - 1) if count > 1 else 0
        starts.append([int(np.round(stride * i)) for i in range(count)])
    return starts


@functools.lru_cache(maxsize=4)
def gaussian_importance(patch_size: Tuple[int, ...], sigma_scale: float = 1.0 / 8, value_scaling: float = 10.0
                        ) -> np.ndarray:
    """The importance map (patch_size) float16: a centre impulse blurred with sigma = patch * sigma_scale, maximum
    ``value_scaling``, zeros set to the least non-zero value; cached (a large blur costs more than a small network's
    forward) and read-only."""
    impulse = np.zeros(patch_size)
    impulse[tuple(p // 2 for p in patch_size)] = 1
    gaussian = gaussian_filter(impulse, [p * sigma_scale for p in patch_size], 0, mode="constant", cval=0)
    gaussian /= gaussian.max() / value_scaling
    gaussian = gaussian.astype(np.float16)
    zero = gaussian == 0
    gaussian[zero] = gaussian[~zero].min()
    gaussian.setflags(write=False)
    return gaussian


def pad_to_patch(data: np.ndarray, patch_size: Sequence[int]) -> Tuple[np.ndarray, Tuple[slice, ...]]:
    """data (C, ..., X, Y) zero-padded on the last axes to at least ``patch_size`` (the image centred, the odd
    pixel after it) -> (padded, the slices of the last axes that undo it)."""
    lead = data.ndim - len(patch_size)
    widths, undo = [(0, 0)] * lead, []
    for size, patch in zip(data.shape[lead:], patch_size):
        missing = max(patch - size, 0)
        widths.append((missing // 2, missing - missing // 2))
        undo.append(slice(missing // 2, missing // 2 + size))
    return np.pad(data, widths, mode="constant"), tuple(undo)


def mirror_combinations(mirror_axes: Optional[Sequence[int]]) -> List[Tuple[int, ...]]:
    """The flips nnU-Net averages over a tile (B, C, X, Y): none, then each combination of mirror axes (0: X, 1: Y)."""
    axes = [a + 2 for a in (mirror_axes or ())]
    return [c for n in range(len(axes) + 1) for c in itertools.combinations(axes, n)]


def sliding_window_logits(data: np.ndarray, sessions: Sequence, patch_size: Sequence[int], step: float,
                          mirror_axes: Optional[Sequence[int]], num_heads: int,
                          progress: Optional[Callable[[int, int], None]] = None) -> np.ndarray:
    """data (C, 1, X, Y) float32 -> logits (num_heads, 1, X, Y) float16: the mean over ``sessions`` (one per fold,
    ``run(batch (N, C, px, py)) -> (N, num_heads, px, py)``) of the sliding-window prediction. ``progress(tiles,
    total)`` after each session call: the tiles it predicted, and the case's tiles times the sessions."""
    return sliding_window_logits_of_cases([data], sessions, patch_size, step, mirror_axes, num_heads, progress)[0]


def sliding_window_logits_of_cases(cases: Sequence[np.ndarray], sessions: Sequence, patch_size: Sequence[int],
                                   step: float, mirror_axes: Optional[Sequence[int]], num_heads: int,
                                   progress: Optional[Callable[[int, int], None]] = None) -> List[np.ndarray]:
    """``sliding_window_logits`` of several cases (a server's concurrent requests), their tiles in the same stacks;
    each case's logits summed in its own tile order, with the same float16 roundings as alone."""
    padded_cases, undos, windows = [], [], []
    gaussian = gaussian_importance(tuple(patch_size))
    flips = mirror_combinations(mirror_axes)
    for c, data in enumerate(cases):
        padded, undo = pad_to_patch(data, patch_size)
        padded_cases.append(padded)
        undos.append(undo)
        starts = tile_starts(padded.shape[2:], patch_size, step)
        windows += [(c, d, (slice(sx, sx + patch_size[0]), slice(sy, sy + patch_size[1])))
                    for d in range(padded.shape[1]) for sx, sy in itertools.product(*starts)]
    weights = [np.zeros(p.shape[1:], dtype=np.float16) for p in padded_cases]  # the same for every session
    for c, d, window in windows:
        weights[c][(d, *window)] += gaussian
    per_call = max(1, MAX_BATCH // len(flips))
    totals: List[Optional[np.ndarray]] = [None] * len(cases)
    for session in sessions:
        logits = [np.zeros((num_heads, *p.shape[1:]), dtype=np.float16) for p in padded_cases]
        for first in range(0, len(windows), per_call):
            chunk = windows[first:first + per_call]
            batch = np.ascontiguousarray(np.concatenate(
                [np.flip(padded_cases[c][(slice(None), d, *window)][None], f) for c, d, window in chunk
                 for f in flips]))
            out = session.run(batch)  # (len(chunk) * len(flips), heads, px, py) float32
            if progress is not None:
                progress(len(chunk), len(windows) * len(sessions))
            if out.shape != (len(batch), num_heads, *patch_size):
                raise UserError(f"the graph returned logits of shape {out.shape} for tiles of shape {batch.shape}, "
                                f"expected {(len(batch), num_heads, *patch_size)}: graph and description do not "
                                f"belong together")
            for i, (c, d, window) in enumerate(chunk):
                copies = out[i * len(flips):(i + 1) * len(flips)]
                prediction = sum(np.flip(copies[j:j + 1], f) for j, f in enumerate(flips))[0] / len(flips)
                region = (slice(None), d, *window)
                # float32 sums rounded to float16, as nnU-Net's in-place addition into its float16 arrays
                logits[c][region] = logits[c][region].astype(np.float32) + prediction * gaussian.astype(np.float32)
        for c in range(len(cases)):
            logits[c] /= weights[c]
            totals[c] = logits[c] if totals[c] is None else totals[c] + logits[c]
    if len(sessions) > 1:
        for total in totals:
            total /= np.float16(len(sessions))
    return [total[(slice(None), slice(None), *undo)] for total, undo in zip(totals, undos)]
