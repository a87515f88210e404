"""Decoupling of the deepest feature into fg / bg / uncertainty features, and training-only full-resolution heads."""
from typing import Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.conv import ConvNormAct

__all__ = ["FeatureDecoupling", "AuxiliaryHeads"]


def _cbt_stack(in_channels: int, mid_channels: int, out_channels: int, n: int, ops: dict) -> nn.Sequential:
    """``n`` CBT3x3 (in -> mid), CBT3x3 (mid -> out), CBT1x1 (out -> out) stacks as one, output channels
    [branch 0, branch 1, ...]; all branches read the same input (first filters stacked)."""
    return nn.Sequential(
        ConvNormAct(in_channels, n * mid_channels, 3, **ops),
        ConvNormAct(n * mid_channels, n * out_channels, 3, groups=n, **ops),
        ConvNormAct(n * out_channels, n * out_channels, 1, groups=n, **ops),
    )


class FeatureDecoupling(nn.Module):
    """Three independent branches CBT3x3 (in -> mid), CBT3x3 (mid -> out), CBT1x1 (out -> out).

    x: (B, in_channels, h, w) -> f_fg, f_bg, f_uc: (B, out_channels, h, w) each. Foreground and background run as one
    stack (``fg_bg``, in a third of the operations) and come out as channel slices of one tensor; f_uc, read only by
    the training-only head, runs alone and is None when ``with_uncertainty=False``.
    """

    def __init__(
        self,
        in_channels: int = 1024,
        mid_channels: int = 512,
        out_channels: int = 128,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.out_channels = out_channels
        self.fg_bg = _cbt_stack(in_channels, mid_channels, out_channels, 2, ops)
        self.uc = _cbt_stack(in_channels, mid_channels, out_channels, 1, ops)

    def forward(self, x: Tensor, with_uncertainty: bool = True) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        c = self.out_channels
        f = self.fg_bg(x)
        f_uc = self.uc(x) if with_uncertainty else None
        return f[:, :c], f[:, c:], f_uc


class AuxiliaryHeads(nn.Module):
    """Foreground, background and uncertainty heads, run as one grouped head; each maps a decoupled feature to logits.

    Each head: CBT3x3 (in -> channels[0]); per c in channels[1:], bilinear x2 and CBT3x3 to c; a 1x1 conv to 1
    channel (no sigmoid). Default: 128 -> 256, x2 256, x2 128, x2 64, x2 64 (H/16 to H). The heads are the groups of
    every convolution. f_fg, f_bg, f_uc: (B, in_channels, h, w) -> fg, bg, uc: (B, 1, h * 2**n, w * 2**n),
    n = len(channels) - 1, channel slices of one tensor.
    """

    HEADS = ("fg", "bg", "uc")

    def __init__(
        self,
        in_channels: int = 128,
        channels: Sequence[int] = (256, 256, 128, 64, 64),
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        n = len(self.HEADS)
        self.stem = ConvNormAct(n * in_channels, n * channels[0], 3, groups=n, **ops)
        self.up_convs = nn.ModuleList(
            [ConvNormAct(n * c_in, n * c_out, 3, groups=n, **ops) for c_in, c_out in zip(channels[:-1], channels[1:])]
        )
        self.out = conv_op(n * channels[-1], n, 1, groups=n, bias=True)

    def forward(self, f_fg: Tensor, f_bg: Tensor, f_uc: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        x = self.stem(torch.cat([f_fg, f_bg, f_uc], dim=1))
        for conv in self.up_convs:
            x = conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        x = self.out(x)
        return x[:, 0:1], x[:, 1:2], x[:, 2:3]
