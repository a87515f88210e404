"""The graph form of CDFA's window attention: the shifted form's identity without in-place writes.

Whole-tensor ops on zero-padded copies: window rows shifted by slicing and stacked, per-displacement sums as one
matmul with a constant 0/1 matrix, values summed from (2k-1)^2 slices. Slices end at negative indices, so an
exported graph (Pad, Slice, Concat, MatMul, Mul, Add) takes any height and width. ``form="graph"`` runs it.
"""
import functools
import operator
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["displacement_matrix", "graph_window_attention"]


def _window(padded: Tensor, start_y: int, start_x: int, pad: int) -> Tensor:
    """The (H, W) window of ``padded`` (..., H + 2 * pad, W + 2 * pad) starting at (start_y, start_x)."""
    end_y, end_x = start_y - 2 * pad, start_x - 2 * pad
    return padded[..., start_y:end_y if end_y else None, start_x:end_x if end_x else None]


@functools.lru_cache(maxsize=None)
def _displacement_rows(kernel_size: int) -> Tuple[Tuple[int, ...], ...]:
    k, span = kernel_size, 2 * kernel_size - 1
    return tuple(tuple(int(j // k - i // k + k - 1 == d // span and j % k - i % k + k - 1 == d % span)
                       for i in range(k * k) for j in range(k * k)) for d in range(span * span))


def displacement_matrix(kernel_size: int, dtype: torch.dtype = torch.float32,
                        device: Optional[torch.device] = None) -> Tensor:
    """M: ((2k-1)^2, k^4), M[d, i * k^2 + j] = 1 where off_j - off_i = d (index d + k - 1 per axis); built from a
    Python list so that a tracer records one constant."""
    return torch.tensor(_displacement_rows(kernel_size), dtype=dtype, device=device)


def graph_window_attention(values: Tensor, weights: Tensor, kernel_size: int) -> Tensor:
    """out(q) = sum_{i, j} A_{q - off_i}[i, j] * v(q - off_i + off_j) per head, zero outside the image.

    values: (B, heads * head_dim, H, W), weights: (B, heads, k*k (i), k*k (j), H, W) -> (B, heads * head_dim, H, W)
    """
    k, r = kernel_size, kernel_size // 2
    heads, window = weights.shape[1:3]
    if window != k * k:
        raise ValueError(f"weights must be (B, heads, {k * k}, {k * k}, H, W), got {tuple(weights.shape)}")
    # row i read at q - off_i: A_{q - off_i}[i, :], from a copy padded by r
    padded = F.pad(weights, (r, r, r, r))
    rows = torch.stack([_window(padded[:, :, i], 2 * r - i // k, 2 * r - i % k, r) for i in range(window)], dim=2)
    # D: one product with M over the last axis (no reshape naming the image size: height and width stay symbolic)
    shifted = rows.flatten(2, 3).permute(0, 1, 3, 4, 2)  # (B, heads, H, W, k^4)
    d = torch.matmul(shifted, displacement_matrix(k, shifted.dtype, shifted.device).t())  # (B, heads, H, W, S^2)
    d = d.permute(0, 1, 4, 2, 3).unsqueeze(3)  # (B, heads, (2k-1)^2, 1, H, W)
    span, pad = 2 * k - 1, 2 * r
    v = F.pad(values, (pad, pad, pad, pad)).unflatten(1, (heads, -1))  # (B, heads, head_dim, H + 4r, W + 4r)
    terms = (d[:, :, dy * span + dx] * _window(v, dy, dx, pad) for dy in range(span) for dx in range(span))
    return functools.reduce(operator.add, terms).flatten(1, 2)
