"""Decoupling of the deepest feature into foreground / background / uncertainty features, and the
auxiliary heads that turn each into a full-resolution map (training only)."""
from typing import Optional, Sequence, Tuple, Type

import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.conv import ConvNormAct

__all__ = ["FeatureDecoupling", "AuxiliaryHead"]


class FeatureDecoupling(nn.Module):
    """Three independent branches CBT3x3 (in -> mid), CBT3x3 (mid -> out), CBT1x1 (out -> out).

    x: (B, in_channels, h, w) -> f_fg, f_bg, f_uc: (B, out_channels, h, w) each
    (f_uc is None when ``with_uncertainty=False``: it only feeds the training-only head).
    """

    BRANCHES = ("fg", "bg", "uc")

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
        self.branches = nn.ModuleDict(
            {
                name: nn.Sequential(
                    ConvNormAct(in_channels, mid_channels, 3, **ops),
                    ConvNormAct(mid_channels, out_channels, 3, **ops),
                    ConvNormAct(out_channels, out_channels, 1, **ops),
                )
                for name in self.BRANCHES
            }
        )

    def forward(self, x: Tensor, with_uncertainty: bool = True) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        f_fg = self.branches["fg"](x)
        f_bg = self.branches["bg"](x)
        f_uc = self.branches["uc"](x) if with_uncertainty else None
        return f_fg, f_bg, f_uc


class AuxiliaryHead(nn.Module):
    """One decoupled feature -> one map of logits (no sigmoid) at 2**len(up_channels) times its size.

    CBT3x3 (in -> up_channels[0]); then per entry c of up_channels[1:] + (last,): bilinear x2 and
    CBT3x3 to c; then a 1x1 conv to 1 channel. Default: 128 -> 256, x2 256, x2 128, x2 64, x2 64
    (from H/16 to H).

    x: (B, in_channels, h, w) -> (B, 1, h * 2**n_up, w * 2**n_up) with n_up = len(channels) - 1
    """

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
        self.stem = ConvNormAct(in_channels, channels[0], 3, **ops)
        self.up_convs = nn.ModuleList(
            [ConvNormAct(c_in, c_out, 3, **ops) for c_in, c_out in zip(channels[:-1], channels[1:])]
        )
        self.out = conv_op(channels[-1], 1, 1, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for conv in self.up_convs:
            x = conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        return self.out(x)
