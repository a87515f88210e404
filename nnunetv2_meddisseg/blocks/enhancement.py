"""Per-level feature enhancement (multi-dilation context block of ConDSeg, our implementation)."""
from typing import Optional, Sequence, Type

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.attention import ChannelAttention, SpatialAttention
from nnunetv2_meddisseg.blocks.conv import ConvNormAct

__all__ = ["FeatureEnhancement"]


class FeatureEnhancement(nn.Module):
    """Enlarge the receptive field of one encoder level and bring it to ``out_channels``.

    Branches: CBT 1x1 and CBT 3x3 with dilation 6 / 12 / 18, each followed by channel attention
    (ratio 16); concat -> Conv3x3-Norm (no activation) + Conv1x1-Norm shortcut of the input ->
    activation -> spatial attention (7x7).

    x: (B, in_channels, H, W) -> (B, out_channels, H, W)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int = 128,
        dilations: Sequence[int] = (6, 12, 18),
        reduction: int = 16,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs)
        branches = [nn.Sequential(ConvNormAct(in_channels, out_channels, 1, nonlin=nonlin, **ops),
                                  ChannelAttention(out_channels, reduction, nonlin))]
        for d in dilations:
            branches.append(nn.Sequential(ConvNormAct(in_channels, out_channels, 3, nonlin=nonlin, dilation=d, **ops),
                                          ChannelAttention(out_channels, reduction, nonlin)))
        self.branches = nn.ModuleList(branches)
        self.fuse = ConvNormAct(out_channels * len(branches), out_channels, 3, nonlin=None, **ops)
        self.shortcut = ConvNormAct(in_channels, out_channels, 1, nonlin=None, **ops)
        self.nonlin = nonlin()
        self.spatial_attention = SpatialAttention(7, bias=False, conv_op=conv_op)

    def forward(self, x: Tensor) -> Tensor:
        fused = self.fuse(torch.cat([branch(x) for branch in self.branches], dim=1))
        return self.spatial_attention(self.nonlin(fused + self.shortcut(x)))
