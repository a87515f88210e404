"""Masked image modelling in 2D for CNNs, masked as SparK masks (Tian et al., ICLR 2023): a random ``MASK_RATIO`` of
square patches is hidden, and the loss is the mean squared error over them. Unlike SparK, convolutions stay dense:
a hidden patch is set to zero (the mean of nnU-Net's z-scores), not skipped, so the network pretrained is exactly
the one fine-tuned.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["MASK_RATIO", "PATCHES_PER_SIDE", "mask_patches", "masked_loss"]

#: the share of patches hidden (SparK's 60 %)
MASK_RATIO = 0.6
#: patches along the shorter side (SparK: 7 of 32 pixels at 224; here 8, at least 2 pixels each)
PATCHES_PER_SIDE = 8


def mask_patches(batch: Tensor, generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """batch (B, C, H, W) -> (the batch with hidden patches set to 0, the mask (B, 1, H, W), 1 where hidden). Each
    image draws its own patches, on the CPU from ``generator``; pixels past the last whole patch stay visible."""
    b, _, h, w = batch.shape
    side = max(2, min(h, w) // PATCHES_PER_SIDE)
    rows, cols = h // side, w // side
    count = rows * cols
    hidden = round(MASK_RATIO * count)
    order = torch.argsort(torch.rand((b, count), generator=generator), dim=1)
    grid = torch.zeros((b, count)).scatter_(1, order[:, :hidden], 1.0)
    grid = grid.reshape(b, 1, rows, cols).repeat_interleave(side, 2).repeat_interleave(side, 3)
    mask = F.pad(grid, (0, w - cols * side, 0, h - rows * side)).to(batch.device, batch.dtype)
    return batch * (1 - mask), mask


def masked_loss(restored: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """The mean squared error of ``restored`` to ``target`` over the hidden pixels (``mask`` 1) of every channel."""
    squared = (restored.float() - target.float()) ** 2 * mask
    return squared.sum() / (mask.sum() * target.shape[1]).clamp_min(1)
