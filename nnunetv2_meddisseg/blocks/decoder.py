"""CBAT decoders D_s, D_m, D_l and their fusion into segmentation logits."""
from typing import List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.attention import CBAT
from nnunetv2_meddisseg.blocks.conv import ConvNormAct

__all__ = ["DECODER_FUSIONS", "upsample_to", "CBATDecoder", "PathHead", "ConcatFusionHead", "MultiScaleCBATDecoder"]

DECODER_FUSIONS = ("sum", "concat")


def upsample_to(x: Tensor, size: Sequence[int]) -> Tensor:
    """x: (B, C, h, w) -> (B, C, *size), bilinear; traced, it always interpolates so the graph fits any input."""
    if tuple(x.shape[2:]) == tuple(size) and not torch.jit.is_tracing():
        return x
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class CBATDecoder(nn.Module):
    """One decoding path (paper Eq. 8): coarse F1 (B, C1, h, w), fine F2 (B, C2, H, W) -> O (B, out_channels, H, W).

    F0 = CBT1x1([Up(F1); F2]); F(t+1) = F(t) + CBT3x3(CBT1x1(F(t))), t < num_steps; O = CBAT(F(num_steps)).
    ``cbat=False`` (the "w/o CBAT" ablation) ends in a CBT3x3 of the same width instead: same depth, no attention.
    """

    def __init__(
        self,
        coarse_channels: int = 128,
        fine_channels: int = 128,
        out_channels: int = 128,
        num_steps: int = 3,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
        cbat: bool = True,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.project = ConvNormAct(coarse_channels + fine_channels, out_channels, 1, **ops)
        self.steps = nn.ModuleList([nn.Sequential(ConvNormAct(out_channels, out_channels, 1, **ops),
                                                  ConvNormAct(out_channels, out_channels, 3, **ops))
                                    for _ in range(num_steps)])
        self.cbat = (CBAT(out_channels, nonlin=nonlin, conv_op=conv_op) if cbat
                     else ConvNormAct(out_channels, out_channels, 3, **ops))

    def forward(self, coarse: Tensor, fine: Tensor) -> Tensor:
        x = self.project(torch.cat([upsample_to(coarse, fine.shape[2:]), fine], dim=1))
        for step in self.steps:
            x = x + step(x)
        return self.cbat(x)


class PathHead(nn.Module):
    """One path's head: CBT3x3 -> Conv1x1 -> bilinear up: (B, in_channels, h, w) -> (B, num_classes, *output_size)."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        hidden_channels: int = 64,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        self.conv = ConvNormAct(in_channels, hidden_channels, 3, conv_op, norm_op, norm_op_kwargs, nonlin)
        self.out = conv_op(hidden_channels, num_classes, 1, bias=True)

    def forward(self, x: Tensor, output_size: Sequence[int]) -> Tensor:
        return upsample_to(self.out(self.conv(x)), output_size)


class ConcatFusionHead(nn.Module):
    """Fusion of the released code / ConDSeg: paths (three (B, C, h_l, w_l), finest first) -> (B, K, *output_size).

    [O_S; Up(O_M); Up(O_L)] -> CBT3x3 (3C -> C) -> Up -> CBT3x3 (C -> 128) -> CBT1x1 (128 -> 64) -> Conv1x1 (64 -> K).
    """

    def __init__(
        self,
        channels: int,
        num_classes: int,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.fuse = ConvNormAct(3 * channels, channels, 3, **ops)
        self.refine = nn.Sequential(ConvNormAct(channels, 128, 3, **ops), ConvNormAct(128, 64, 1, **ops))
        self.out = conv_op(64, num_classes, 1, bias=True)

    def forward(self, paths: Sequence[Tensor], output_size: Sequence[int]) -> Tensor:
        size = paths[0].shape[2:]
        x = self.fuse(torch.cat([upsample_to(p, size) for p in paths], dim=1))
        return self.out(self.refine(upsample_to(x, output_size)))


class MultiScaleCBATDecoder(nn.Module):
    """The three CBAT decoding paths and their fusion into logits.

    D_s(f2, f1) at H/2, D_m(f3, f2) at H/4, D_l(f4, f3) at H/8. ``fusion="sum"`` (paper Eq. 9): a ``PathHead`` per
    path, logits = O_S + O_M + O_L; ``"concat"`` (released code): ``ConcatFusionHead``, no per-path logits.

    features: [f1 (B, C, H/2, W/2), f2 (H/4), f3 (H/8), f4 (H/16)], output_size (H, W) ->
    (logits (B, K, H, W), path logits (O_S, O_M, O_L) each (B, K, H, W) or None, O_S (B, C, H/2, W/2))
    """

    def __init__(
        self,
        channels: int = 128,
        num_classes: int = 2,
        fusion: str = "sum",
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
        cbat: bool = True,
    ) -> None:
        super().__init__()
        if fusion not in DECODER_FUSIONS:
            raise ValueError(f"unknown decoder_fusion {fusion!r}: choose one of {list(DECODER_FUSIONS)}")
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.fusion = fusion
        self.small, self.medium, self.large = (CBATDecoder(channels, channels, channels, cbat=cbat, **ops)
                                               for _ in range(3))
        if fusion == "sum":
            self.path_heads = nn.ModuleList([PathHead(channels, num_classes, **ops) for _ in range(3)])
        else:
            self.fusion_head = ConcatFusionHead(channels, num_classes, **ops)

    def forward(
        self, features: Sequence[Tensor], output_size: Sequence[int]
    ) -> Tuple[Tensor, Optional[Tuple[Tensor, Tensor, Tensor]], Tensor]:
        f1, f2, f3, f4 = features
        paths: List[Tensor] = [self.small(f2, f1), self.medium(f3, f2), self.large(f4, f3)]
        if self.fusion == "sum":
            path_logits = tuple(head(p, output_size) for head, p in zip(self.path_heads, paths))
            logits = path_logits[0] + path_logits[1] + path_logits[2]
            return logits, path_logits, paths[0]
        return self.fusion_head(paths, output_size), None, paths[0]
