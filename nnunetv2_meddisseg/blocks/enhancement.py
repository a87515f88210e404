"""Per-level feature enhancement (multi-dilation context block of ConDSeg, our implementation)."""
from typing import Optional, Sequence, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU, attention_sigmoid
from nnunetv2_meddisseg.blocks.attention import SpatialAttention, _hidden
from nnunetv2_meddisseg.blocks.conv import ConvNormAct, PointwiseLinear, same_padding

__all__ = ["FeatureEnhancement"]


class FeatureEnhancement(nn.Module):
    """Enlarge the receptive field of one encoder level: (B, in_channels, H, W) -> (B, out_channels, H, W).

    Branches: CBT 1x1 and CBT 3x3 with dilation 6 / 12 / 18, each followed by channel attention (ratio 16); concat ->
    Conv3x3-Norm (no activation) + Conv1x1-Norm shortcut of the input -> activation -> spatial attention (7x7).

    Parallel parts run batched, the same function as separate branches: one 1x1 conv for shortcut and branch 0
    (``pointwise``), one per-channel norm over all branches, one activation, all channel attentions in two grouped
    products with stacked MLP weights (``attention_hidden``, ``attention_out``: branch i's rows are share i).
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
        self.out_channels = out_channels
        self.dilations = tuple(dilations)
        n = self.num_branches = 1 + len(self.dilations)
        hidden = _hidden(out_channels, reduction)
        self.pointwise = conv_op(in_channels, 2 * out_channels, 1, bias=False)
        self.dilated = nn.ModuleList([conv_op(in_channels, out_channels, 3, padding=same_padding(3, d), dilation=d,
                                              bias=False) for d in self.dilations])
        self.norm = norm_op((n + 1) * out_channels, **(norm_op_kwargs or {}))
        # the branches' channel-attention MLPs, as the kernels of two grouped 1x1 convolutions
        self.attention_hidden = PointwiseLinear(out_channels, n * hidden, bias=False)
        self.attention_out = PointwiseLinear(hidden, n * out_channels, bias=False)
        self.fuse = ConvNormAct(out_channels * n, out_channels, 3, nonlin=None, **ops)
        self.nonlin = nonlin()
        self.spatial_attention = SpatialAttention(7, bias=False, conv_op=conv_op)

    def branch_channel_attention(self, y: Tensor) -> Tensor:
        """The channel attention of every branch at once: y (B, n * C, H, W) -> weights (B, n * C, 1, 1).

        Per branch i, sigmoid(MLP_i(avgpool) + MLP_i(maxpool)), MLP_i = Linear(C, C/r) -> activation -> Linear(C/r, C),
        no biases; both poolings (2B) go through two grouped 1x1 convs, n groups, branch i's rows in group i.
        """
        b, n = y.shape[0], self.num_branches
        w1, w2 = self.attention_hidden.weight, self.attention_out.weight
        pooled = torch.cat([y.mean(dim=(2, 3), keepdim=True), y.amax(dim=(2, 3), keepdim=True)])  # (2B, n * C, 1, 1)
        out = F.conv2d(self.nonlin(F.conv2d(pooled, w1, groups=n)), w2, groups=n)  # (2B, n * C, 1, 1)
        return attention_sigmoid(out.view(2, b, *out.shape[1:]).sum(dim=0))

    def forward(self, x: Tensor) -> Tensor:
        c = self.out_channels
        y = self.norm(torch.cat([self.pointwise(x)] + [conv(x) for conv in self.dilated], dim=1))
        shortcut, y = y[:, :c], self.nonlin(y[:, c:])
        fused = self.fuse(y * self.branch_channel_attention(y))
        return self.spatial_attention(self.nonlin(fused + shortcut))
