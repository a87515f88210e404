"""The light segmentation head of Stage I (encoder pre-training).

It turns the four ELAT-refined features (``output="encoder"``) into logits to train the encoder before the decoder
exists. Not part of ``MedDisSegNet``: the trainer owns it, keeps it in Stage I checkpoints, drops it at Stage II.
"""
from typing import Optional, Sequence, Tuple, Type

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.conv import ConvNormAct
from nnunetv2_meddisseg.blocks.decoder import upsample_to
from nnunetv2_meddisseg.blocks.encoder import ENCODER_CHANNELS

__all__ = ["Stage1Head"]


class Stage1Head(nn.Module):
    """Per level a 1x1 CBT to ``width`` channels and bilinear up-sampling; concatenation; a 1x1 conv to logits.

    ``num_classes``: nnU-Net's number of segmentation heads; ``in_channels``: the encoder's, shallowest first;
    ``width``: 64 in the paper (4 x 64 = 256 fused channels).

    forward(features, output_size=None): features (B, C_i, H_i, W_i) per level; output_size (H, W) defaults to twice
    the first (stride-2) feature's size. Returns ``(logits, fused)``: logits (B, num_classes, H, W) and the fused
    feature (B, len(in_channels) * width, H, W) they come from (the Stage I "late" layer, for ``placement="late"``).
    """

    def __init__(self, num_classes: int, in_channels: Sequence[int] = ENCODER_CHANNELS, width: int = 64,
                 norm_op: Type[nn.Module] = nn.BatchNorm2d, nonlin: Type[nn.Module] = TeLU,
                 norm_op_kwargs: Optional[dict] = None) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"Stage1Head: num_classes must be >= 1, got {num_classes}")
        self.in_channels = tuple(int(c) for c in in_channels)
        self.projections = nn.ModuleList(
            ConvNormAct(c, width, kernel_size=1, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
            for c in self.in_channels
        )
        self.classifier = nn.Conv2d(len(self.in_channels) * width, num_classes, kernel_size=1)

    def forward(self, features: Sequence[Tensor],
                output_size: Optional[Tuple[int, int]] = None) -> Tuple[Tensor, Tensor]:
        if len(features) != len(self.projections):
            raise ValueError(f"Stage1Head expects {len(self.projections)} feature maps, got {len(features)}")
        if output_size is None:
            output_size = (2 * features[0].shape[-2], 2 * features[0].shape[-1])
        fused = torch.cat([upsample_to(projection(feature), output_size)
                           for projection, feature in zip(self.projections, features)], dim=1)
        return self.classifier(fused), fused
