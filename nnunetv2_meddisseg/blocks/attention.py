"""Attention blocks: CBAM-style channel / spatial attention, CBAT (decoder side) and ELAT (encoder side)."""
from typing import Sequence, Type

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU, attention_sigmoid
from nnunetv2_meddisseg.blocks.conv import PointwiseLinear, memory_format_of

__all__ = ["ChannelAttention", "SpatialAttention", "CBAT", "ELAT"]


def _hidden(channels: int, reduction: int) -> int:
    if reduction < 1:
        raise ValueError(f"reduction must be >= 1, got {reduction}")
    return max(1, channels // reduction)


class ChannelAttention(nn.Module):
    """CBAM channel attention: out = x * sigmoid(MLP(avgpool(x)) + MLP(maxpool(x))), (B, C, H, W) -> same.

    MLP: Linear(C, C/r) -> nonlin -> Linear(C/r, C), as 1x1 convolutions on the pooled (B, C, 1, 1) features.
    """

    def __init__(
        self, channels: int, reduction: int = 16, nonlin: Type[nn.Module] = TeLU, bias: bool = False
    ) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction)
        self.mlp = nn.Sequential(
            PointwiseLinear(channels, hidden, bias=bias), nonlin(), PointwiseLinear(hidden, channels, bias=bias)
        )

    def attention(self, x: Tensor) -> Tensor:
        """Channel weights a: (B, C, 1, 1) in (0, 1). Both poolings pass the MLP as one batch of 2B."""
        b = x.shape[0]
        both = self.mlp(torch.cat([x.mean(dim=(2, 3), keepdim=True), x.amax(dim=(2, 3), keepdim=True)]))
        # (2B, C, 1, 1): avg rows, then max rows
        return attention_sigmoid(both.view(2, b, *both.shape[1:]).sum(dim=0))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.attention(x)


class SpatialAttention(nn.Module):
    """CBAM spatial attention: a = sigmoid(conv_kxk([mean_c(x); max_c(x)])); out = x * a, (B, C, H, W) -> same."""

    def __init__(self, kernel_size: int = 7, bias: bool = False, conv_op: Type[nn.Module] = nn.Conv2d) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.conv = conv_op(2, 1, kernel_size, padding=kernel_size // 2, bias=bias)

    def attention(self, x: Tensor) -> Tensor:
        """Spatial weights a: (B, 1, H, W) in (0, 1)."""
        pooled = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
        # (B, 1, H, W) halves carry no channel order, so cat gives NCHW: keep x's format for the convolution
        return attention_sigmoid(self.conv(pooled.contiguous(memory_format=memory_format_of(x))))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.attention(x)


class CBAT(nn.Module):
    """Med-DisSeg's decoder-side CBAM (channel then spatial; biases, ``nonlin`` in the MLP): (B, C, H, W) -> same."""

    def __init__(
        self,
        channels: int,
        reduction: int = 16,
        kernel_size: int = 7,
        nonlin: Type[nn.Module] = TeLU,
        conv_op: Type[nn.Module] = nn.Conv2d,
    ) -> None:
        super().__init__()
        self.channel = ChannelAttention(channels, reduction, nonlin, bias=True)
        self.spatial = SpatialAttention(kernel_size, bias=True, conv_op=conv_op)

    def forward(self, x: Tensor) -> Tensor:
        return self.spatial(self.channel(x))


class ELAT(nn.Module):
    """Med-DisSeg's encoder-side attention, out = x * a_c * a_s: (B, C, H, W) -> same.

    - channel: a_c = sigmoid(Linear(C/r, C)(nonlin(Linear(C, C/r)(GAP(x))))), no biases, Linears as 1x1 convs;
    - spatial: a_s = sigmoid(conv1x1_fuse([conv3x3_d(x) for d in dilations])), each conv C -> 1.
    """

    def __init__(
        self,
        channels: int,
        reduction: int = 8,
        nonlin: Type[nn.Module] = TeLU,
        dilations: Sequence[int] = (1, 2, 3),
        conv_op: Type[nn.Module] = nn.Conv2d,
    ) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction)
        self.channel_mlp = nn.Sequential(
            PointwiseLinear(channels, hidden, bias=False), nonlin(), PointwiseLinear(hidden, channels, bias=False)
        )
        self.spatial_convs = nn.ModuleList([conv_op(channels, 1, 3, padding=d, dilation=d) for d in dilations])
        self.spatial_fuse = conv_op(len(dilations), 1, 1)

    def channel_attention(self, x: Tensor) -> Tensor:
        """a_c: (B, C, 1, 1)"""
        return attention_sigmoid(self.channel_mlp(x.mean(dim=(2, 3), keepdim=True)))

    def spatial_attention(self, x: Tensor) -> Tensor:
        """a_s: (B, 1, H, W)"""
        return attention_sigmoid(self.spatial_fuse(torch.cat([conv(x) for conv in self.spatial_convs], dim=1)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.channel_attention(x) * self.spatial_attention(x)
