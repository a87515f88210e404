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

    def branch_channel_attention(self, y: Tensor) -> Tensor:
        """The channel attention of every branch at once.

        y: the activated branch outputs, concatenated (B, n * C, H, W) -> their weights (B, n * C, 1, 1),
        equal to ``branches[i][1].attention`` of each branch's part. Both poolings of all branches pass
        their branch's MLP (no biases) in two batched matrix products.
        """
        b, n = y.shape[0], len(self.branches)
        c = y.shape[1] // n
        mlps = [branch[1].mlp for branch in self.branches]
        pooled = torch.stack([y.mean(dim=(2, 3)), y.amax(dim=(2, 3))]).view(2 * b, n, c).transpose(0, 1)  # (n, 2B, C)
        hidden = torch.bmm(pooled, torch.stack([m[0].weight for m in mlps]).transpose(1, 2))  # (n, 2B, C / r)
        out = torch.bmm(mlps[0][1](hidden), torch.stack([m[2].weight for m in mlps]).transpose(1, 2))  # (n, 2B, C)
        return torch.sigmoid(out.view(n, 2, b, c).sum(dim=1)).transpose(0, 1).reshape(b, n * c, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        # every branch's conv and norm, then one activation and one batched channel attention for all of them
        # (the same values as running each branch on its own: the activation is element-wise)
        y = torch.cat([branch[0].norm(branch[0].conv(x)) for branch in self.branches], dim=1)
        y = self.branches[0][0].nonlin(y)
        fused = self.fuse(y * self.branch_channel_attention(y))
        return self.spatial_attention(self.nonlin(fused + self.shortcut(x)))
