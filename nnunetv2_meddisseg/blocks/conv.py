"""Conv + Norm + activation block (the paper's "CBT": Conv, BatchNorm, TeLU)."""
from typing import Optional, Type

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU

__all__ = ["memory_format_of", "same_padding", "ConvNormAct", "PointwiseLinear"]


def memory_format_of(x: Tensor) -> torch.memory_format:
    """``torch.channels_last`` where the channels of a (B, C, H, W) tensor are its innermost axis (a
    channels-last tensor or a channel slice of one), else ``torch.contiguous_format``."""
    if x.dim() == 4 and x.shape[1] > 1 and x.stride(1) < x.stride(3):
        return torch.channels_last
    return torch.contiguous_format


def same_padding(kernel_size: int, dilation: int = 1) -> int:
    """Padding that keeps the spatial size for an odd kernel at stride 1."""
    if kernel_size % 2 != 1:
        raise ValueError(f"kernel_size must be odd for 'same' padding, got {kernel_size}")
    return dilation * (kernel_size - 1) // 2


class PointwiseLinear(nn.Conv2d):
    """Linear layer over the channel axis stored as a 1x1 convolution (weight (out, in, 1, 1)): (B, in_features, H, W)
    -> (B, out_features, H, W) in one operation. Initialised as ``nn.Linear``, ``nn.Conv2d``'s own 1x1 default."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__(in_features, out_features, 1, bias=bias)


class ConvNormAct(nn.Module):
    """conv_op -> norm_op -> nonlin, 'same' padding: (B, C_in, H, W) -> (B, C_out, H / stride, W / stride).

    ``kernel_size`` is odd; ``norm_op=None`` / ``nonlin=None`` skip the norm / activation (CBT's "act=False");
    ``conv_bias`` is off as the norm follows. ``groups`` builds independent blocks in one (norm and activation being per
    channel), each with the weight shapes and initial statistics of a separate block (fan-in per group).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Optional[Type[nn.Module]] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Optional[Type[nn.Module]] = TeLU,
        nonlin_kwargs: Optional[dict] = None,
        dilation: int = 1,
        stride: int = 1,
        conv_bias: bool = False,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.conv = conv_op(in_channels, out_channels, kernel_size, stride=stride,
                            padding=same_padding(kernel_size, dilation), dilation=dilation, groups=groups,
                            bias=conv_bias)
        self.norm = norm_op(out_channels, **(norm_op_kwargs or {})) if norm_op is not None else nn.Identity()
        self.nonlin = nonlin(**(nonlin_kwargs or {})) if nonlin is not None else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.nonlin(self.norm(self.conv(x)))
