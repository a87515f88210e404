"""Contrast-driven feature aggregation (CDFA, after ConDSeg) and the guidance pyramid feeding it."""
from typing import List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.conv import ConvNormAct

__all__ = ["ContrastDrivenAggregation", "GuidanceBranch", "ContrastGuidancePyramid"]


class ContrastDrivenAggregation(nn.Module):
    """Window attention whose weights are generated from foreground, then background guidance.

    Per pixel p, a Linear layer on the guidance feature g(p) gives logits A(p) of shape
    (num_heads, k*k, k*k); A = softmax(A * head_dim**-0.5) over the last axis. For the k x k window
    around p (positions i, j, zero padding outside the image), head h writes to the pixel at window
    position i the value sum_j A[h, i, j] * v_h(p + offset_j); the contributions of all windows are
    summed (fold) and a Linear projection follows. This is applied first with the foreground
    guidance on v = Linear(x), then with the background guidance directly on that result (the same
    projection after both).
    Input and output each pass two Conv3x3-Norm-act blocks.

    x: (B, in_channels, H, W), fg, bg: (B, dim, H, W) -> (B, dim, H, W)
    """

    def __init__(
        self,
        in_channels: int,
        dim: int = 128,
        num_heads: int = 4,
        kernel_size: int = 3,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.kernel_size = kernel_size
        self.scale = self.head_dim ** -0.5
        window = kernel_size * kernel_size
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.input_convs = nn.Sequential(ConvNormAct(in_channels, dim, 3, **ops), ConvNormAct(dim, dim, 3, **ops))
        self.value = nn.Linear(dim, dim)
        self.attn_fg = nn.Linear(dim, num_heads * window * window)
        self.attn_bg = nn.Linear(dim, num_heads * window * window)
        self.proj = nn.Linear(dim, dim)
        self.output_convs = nn.Sequential(ConvNormAct(dim, dim, 3, **ops), ConvNormAct(dim, dim, 3, **ops))

    @staticmethod
    def _channels_last_linear(layer: nn.Linear, x: Tensor) -> Tensor:
        """Apply ``layer`` over the channel axis: (B, C, H, W) -> (B, C_out, H, W)."""
        return layer(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def window_weights(self, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """guidance: (B, dim, H, W) -> softmaxed weights (B, heads, H*W, k*k (i), k*k (j))."""
        b, _, h, w = guidance.shape
        window = self.kernel_size * self.kernel_size
        logits = layer(guidance.flatten(2).transpose(1, 2))  # (B, HW, heads * window * window)
        logits = logits.reshape(b, h * w, self.num_heads, window, window).transpose(1, 2)
        return torch.softmax(logits * self.scale, dim=-1)

    def window_attention(self, values: Tensor, weights: Tensor) -> Tensor:
        """values: (B, dim, H, W), weights: (B, heads, H*W, k*k, k*k) -> projected (B, dim, H, W)."""
        b, c, h, w = values.shape
        k, window = self.kernel_size, self.kernel_size * self.kernel_size
        # unfold channel index is c * window + j, c = head * head_dim + d
        v = F.unfold(values, k, padding=k // 2).reshape(b, self.num_heads, self.head_dim, window, h * w)
        v = v.permute(0, 1, 4, 3, 2)  # (B, heads, HW, j, head_dim)
        out = torch.matmul(weights, v)  # (B, heads, HW, i, head_dim)
        out = out.permute(0, 1, 4, 3, 2).reshape(b, c * window, h * w)
        out = F.fold(out, (h, w), k, padding=k // 2)  # sums the overlapping window contributions
        return self._channels_last_linear(self.proj, out)

    def forward(self, x: Tensor, fg: Tensor, bg: Tensor) -> Tensor:
        x = self.input_convs(x)
        v = self._channels_last_linear(self.value, x)
        x = self.window_attention(v, self.window_weights(fg, self.attn_fg))
        x = self.window_attention(x, self.window_weights(bg, self.attn_bg))
        return self.output_convs(x)


class GuidanceBranch(nn.Module):
    """Bring a decoupled feature to a finer level: CBT3x3, then ``num_upsamplings`` x
    [bilinear x2, CBT3x3].

    x: (B, in_channels, h, w) -> (B, out_channels, h * 2**n, w * 2**n)
    """

    def __init__(
        self,
        in_channels: int = 128,
        out_channels: int = 128,
        num_upsamplings: int = 0,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.stem = ConvNormAct(in_channels, out_channels, 3, **ops)
        self.up_convs = nn.ModuleList(
            [ConvNormAct(out_channels, out_channels, 3, **ops) for _ in range(num_upsamplings)]
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for conv in self.up_convs:
            x = conv(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False))
        return x


class ContrastGuidancePyramid(nn.Module):
    """f_fg, f_bg at the deepest level -> one (fg, bg) guidance pair per CDFA level.

    ``num_upsamplings[l]`` is the number of x2 steps from the deepest level to level l
    (default (3, 2, 1, 0): levels 1..4 at H/2, H/4, H/8, H/16 from H/16). fg and bg have their own
    branches at every level.

    f_fg, f_bg: (B, C, h, w) -> [(fg_l, bg_l): (B, out_channels, h * 2**n_l, w * 2**n_l)] for each level
    """

    def __init__(
        self,
        in_channels: int = 128,
        out_channels: int = 128,
        num_upsamplings: Sequence[int] = (3, 2, 1, 0),
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Type[nn.Module] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Type[nn.Module] = TeLU,
    ) -> None:
        super().__init__()
        ops = dict(conv_op=conv_op, norm_op=norm_op, norm_op_kwargs=norm_op_kwargs, nonlin=nonlin)
        self.fg = nn.ModuleList([GuidanceBranch(in_channels, out_channels, n, **ops) for n in num_upsamplings])
        self.bg = nn.ModuleList([GuidanceBranch(in_channels, out_channels, n, **ops) for n in num_upsamplings])

    def forward(self, f_fg: Tensor, f_bg: Tensor) -> List[Tuple[Tensor, Tensor]]:
        return [(fg(f_fg), bg(f_bg)) for fg, bg in zip(self.fg, self.bg)]
