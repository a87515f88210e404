"""The light segmentation head of Stage I (encoder pre-training).

In Stage I the network returns its four ELAT-refined features (``output="encoder"``); this head turns them
into logits so that the encoder can be trained on the segmentation task before the full decoder exists. It is
not part of ``MedDisSegNet`` (prediction never sees it): the trainer owns it, stores it in Stage I checkpoints
and drops it at the switch to Stage II.
"""
from typing import Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.conv import ConvNormAct
from nnunetv2_meddisseg.blocks.encoder import ENCODER_CHANNELS

__all__ = ["Stage1Head"]


class Stage1Head(nn.Module):
    """Per level a 1x1 CBT (Conv-BN-TeLU) to ``width`` channels, bilinear up-sampling to the output
    size, concatenation, and a 1x1 convolution to ``num_classes`` logits.

    Args:
        num_classes: output channels (nnU-Net's number of segmentation heads).
        in_channels: channels of the encoder features, shallowest first (ResNet-50: 64, 256, 512, 1024).
        width: channels per level after the 1x1 CBT (64 in the paper: 4 x 64 = 256 fused channels).
        norm_op, norm_op_kwargs, nonlin: the normalisation and activation of the CBT blocks.

    forward(features, output_size=None):
        features: sequence of (B, C_i, H_i, W_i), one per level, shallowest first.
        output_size: (H, W) of the logits; default: twice the size of the first (stride-2) feature.
        Returns ``(logits, fused)``: logits (B, num_classes, H, W) and the fused feature
        (B, len(in_channels) * width, H, W) the logits are computed from (the "late" layer of the
        Stage I model, where a dispersive loss with ``placement="late"`` is applied).
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
        levels = []
        for projection, feature in zip(self.projections, features):
            x = projection(feature)
            if tuple(x.shape[-2:]) != tuple(output_size):
                x = F.interpolate(x, size=output_size, mode="bilinear", align_corners=False)
            levels.append(x)
        fused = torch.cat(levels, dim=1)
        return self.classifier(fused), fused
