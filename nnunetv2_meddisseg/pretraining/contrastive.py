"""SimCLR contrastive pretraining in 2D (Chen et al., ICML 2020): NT-Xent on the encoder's pooled, projected deepest
feature of two augmented views per image. Only the encoder learns: nnU-Net's decoder keeps its initialisation.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["TEMPERATURE", "PROJECTION_DIM", "ContrastiveNet", "nt_xent"]

#: NT-Xent's temperature (SimCLR's choice for small batches lies between 0.1 and 0.5)
TEMPERATURE = 0.2
PROJECTION_DIM = 128


class ContrastiveNet(nn.Module):
    """``encoder``, global max pooling of its deepest feature, a projection MLP: x (B, C, H, W) -> (B, PROJECTION_DIM).
    ``network``: the network holding ``encoder``, whose weights are written, or None where that is ``encoder``."""

    def __init__(self, encoder: nn.Module, network: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.network = network
        width = int(encoder.output_channels[-1])
        self.projection = nn.Sequential(nn.Linear(width, width), nn.ReLU(inplace=True),
                                        nn.Linear(width, PROJECTION_DIM))

    def forward(self, x: Tensor) -> Tensor:
        features = self.encoder(x)
        deepest = features[-1] if isinstance(features, (list, tuple)) else features
        # max, not SimCLR's mean: after instance norm every channel's spatial mean is about the same for any image
        return self.projection(deepest.amax(dim=(2, 3)))


def nt_xent(projections: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """NT-Xent of ``projections`` (2B, D): rows i and i + B view one image (positives); other rows are negatives."""
    z = F.normalize(projections.float(), dim=1)
    n = z.shape[0] // 2
    logits = z @ z.t() / temperature
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    twins = torch.arange(2 * n, device=z.device).roll(n)  # row i's positive: row i + n, and back
    return F.cross_entropy(logits, twins)
