"""Contrast-driven feature aggregation (CDFA, after ConDSeg) and the guidance pyramid feeding it.

Per head, the window attention computes out(q) = sum_d D_d(q) * v(q + d) over d in [-(k-1), k-1]^2 (zero
outside the image), with D_d(q) = sum_{i, j: off_j - off_i = d} A_{q - off_i}[i, j]. Its three forms agree up
to rounding; ``form`` picks one (``blocks.device_forms``): fused Triton ops on CUDA, no intermediate k*k times
the values' size (``blocks.cdfa_kernels``); shifted views on the CPU, no k x k windows (``blocks.cdfa_shifted``);
whole-tensor ops for ONNX export (``blocks.cdfa_graph``). The tests check them against unfold -> per-pixel
matmul -> fold (``tests/blocks/reference_impls.py``).
"""
from typing import List, Optional, Sequence, Tuple, Type

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.cdfa_graph import graph_window_attention
from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available, offset_aggregate, window_offset_weights
from nnunetv2_meddisseg.blocks.cdfa_shifted import displacement_sum, window_displacement_weights
from nnunetv2_meddisseg.blocks.conv import ConvNormAct, PointwiseLinear
from nnunetv2_meddisseg.blocks.device_forms import give_up_fused, implementation_form, resolve_form

__all__ = ["ContrastDrivenAggregation", "PointwiseLinear", "ContrastGuidancePyramid", "window_displacement_weights",
           "displacement_sum"]


def _is_triton_error(error: BaseException) -> bool:
    """Whether ``error`` comes from Triton (building or launching a kernel)."""
    return any((type(e).__module__ or "").startswith("triton") for e in (error, error.__cause__) if e is not None)


def _fp16_autocast(device_type: str) -> bool:
    """Whether fp16 autocast is on for ``device_type`` (False on meta: torch refuses to ask there)."""
    return (device_type != "meta" and torch.is_autocast_enabled(device_type)
            and torch.get_autocast_dtype(device_type) == torch.float16)


def _at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in fp32 if it is in a lower precision (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class ContrastDrivenAggregation(nn.Module):
    """Window attention whose weights come from the foreground, then the background guidance.

    Per pixel p, a Linear layer on the guidance g(p) gives logits A(p) (num_heads, k*k, k*k), and
    A = softmax(A * head_dim**-0.5) over the last axis. In the k x k window around p (zero padding), head h
    writes sum_j A[h, i, j] * v_h(p + offset_j) to window position i; windows are summed (fold), then projected.
    Foreground guidance acts on v = Linear(x), background guidance on that result (same projection). Input and
    output each pass two Conv3x3-Norm-act blocks. ``form``: None (by device) or one of ``device_forms.FORMS``.

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
        form: Optional[str] = None,
    ) -> None:
        super().__init__()
        self.form = form
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
        self.value = PointwiseLinear(dim, dim)
        self.attn_fg = nn.Linear(dim, num_heads * window * window)
        self.attn_bg = nn.Linear(dim, num_heads * window * window)
        self.proj = PointwiseLinear(dim, dim)
        self.output_convs = nn.Sequential(ConvNormAct(dim, dim, 3, **ops), ConvNormAct(dim, dim, 3, **ops))

    @property
    def form(self) -> Optional[str]:
        """The implementation form (one of ``device_forms.FORMS``); None: by the input's device."""
        return self._form

    @form.setter
    def form(self, form: Optional[str]) -> None:
        self._form = resolve_form(form)

    @staticmethod
    def _pointwise(layer: nn.Module, x: Tensor) -> Tensor:
        """``layer`` (Linear or PointwiseLinear) as a 1x1 convolution: (B, C, H, W) -> (B, C_out, H, W)."""
        weight = layer.weight if layer.weight.ndim == 4 else layer.weight.view(*layer.weight.shape, 1, 1)
        return F.conv2d(x, weight, layer.bias)

    def window_weights(self, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """guidance: (B, dim, H, W) -> softmaxed weights (B, heads, k*k (i), k*k (j), H, W)."""
        b, _, h, w = guidance.shape
        window = self.kernel_size * self.kernel_size
        logits = self._pointwise(layer, guidance).view(b, self.num_heads, window, window, h, w)
        return torch.softmax(logits.mul_(self.scale), dim=3)

    def window_attention(self, values: Tensor, weights: Tensor) -> Tensor:
        """values: (B, dim, H, W), weights: (B, heads, k*k, k*k, H, W) -> projected (B, dim, H, W); equals
        unfold, per-pixel weights, fold (overlaps summed) and projection."""
        out = displacement_sum(values, window_displacement_weights(weights, self.kernel_size))
        return self._pointwise(self.proj, out)

    def window_attention_fused(self, values: Tensor, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """Fused ``window_attention(values, window_weights(guidance, layer))``, guidance (B, dim, H, W): logits ->
        offset weights (B, heads, (2k-1)^2, H, W) in fp32 -> values summed, one Triton kernel per step."""
        logits = self._pointwise(layer, guidance)
        weights = window_offset_weights(logits, self.scale, self.num_heads, self.kernel_size)
        return self._pointwise(self.proj, offset_aggregate(values, weights))

    def window_attention_graph(self, values: Tensor, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """Graph ``window_attention(values, window_weights(guidance, layer))``, shapes as the fused one: no
        in-place operation, so that a tracer (the ONNX exporter) records every step."""
        window = self.kernel_size * self.kernel_size
        logits = self._pointwise(layer, guidance).unflatten(1, (self.num_heads, window, window))
        weights = torch.softmax(logits * self.scale, dim=3)  # (B, heads, k*k (i), k*k (j), H, W)
        return self._pointwise(self.proj, graph_window_attention(values, weights, self.kernel_size))

    def _aggregate(self, x: Tensor, fg: Tensor, bg: Tensor) -> Tensor:
        """Value projection, both window attentions and the first output block (shapes as ``forward``)."""
        v = self._pointwise(self.value, x)
        form = implementation_form(x, self.form)
        if form == "fused":
            if not fused_cdfa_available(x):
                raise RuntimeError("the fused CDFA form needs Triton and CUDA tensors (or TRITON_INTERPRET=1)")
            try:
                fused = self.window_attention_fused(v, fg, self.attn_fg)
                return self.output_convs[0](self.window_attention_fused(fused, bg, self.attn_bg))
            except Exception as error:  # Triton could not build or launch a kernel here: the shifted form
                if self.form is not None or torch.compiler.is_compiling() or not _is_triton_error(error):
                    raise
                give_up_fused(f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}")
                form = "shifted"
        if form == "graph":
            x = self.window_attention_graph(v, fg, self.attn_fg)
            x = self.window_attention_graph(x, bg, self.attn_bg)
        else:
            x = self.window_attention(v, self.window_weights(fg, self.attn_fg))
            x = self.window_attention(x, self.window_weights(bg, self.attn_bg))
        return self.output_convs[0](x)

    def forward(self, x: Tensor, fg: Tensor, bg: Tensor) -> Tensor:
        x = self.input_convs(x)
        # With no norm from the value projection to the first output conv's, all three are scale-invariant, so their
        # weights and the conv's output grow freely (Adam, no weight decay: 55 -> 18,800 in 775 steps of
        # benchmarks/amp_probe.py). Past fp16's max (65504) every step is skipped, so fp16 autocast runs this in fp32
        # (bf16 has fp32's exponent range).
        if _fp16_autocast(x.device.type):
            with torch.autocast(device_type=x.device.type, enabled=False):
                x = self._aggregate(_at_least_fp32(x), _at_least_fp32(fg), _at_least_fp32(bg))
        else:
            x = self._aggregate(x, fg, bg)
        return self.output_convs[1:](x)


class ContrastGuidancePyramid(nn.Module):
    """f_fg, f_bg at the deepest level -> one (fg, bg) guidance pair per CDFA level.

    ``num_upsamplings[l]``: x2 steps to level l (default (3, 2, 1, 0): H/2 .. H/16 from H/16). fg and bg have a
    branch per level: CBT3x3, then ``num_upsamplings[l]`` x [bilinear x2, CBT3x3]. All branches run as one: a
    grouped CBT3x3 stem (groups fg, bg; channels [fg of every level, bg of every level]), then per step s one
    bilinear x2 and one CBT3x3 grouped by branch over the levels with more than s steps. A group sees only its
    branch and norm and activation are per channel, so this equals separate branches.

    f_fg, f_bg: (B, in_channels, h, w) -> per level (fg_l, bg_l): (B, out_channels, h * 2**n_l, w * 2**n_l),
    channel slices of one tensor
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
        self.num_upsamplings = tuple(int(n) for n in num_upsamplings)
        if not self.num_upsamplings or min(self.num_upsamplings) < 0:
            raise ValueError(f"num_upsamplings must be non-negative counts, one per level, got {num_upsamplings}")
        self.out_channels = out_channels
        levels = len(self.num_upsamplings)
        #: the levels that step s up-samples, in level order
        self.step_levels: List[List[int]] = [[lv for lv, n in enumerate(self.num_upsamplings) if n > s]
                                             for s in range(max(self.num_upsamplings))]
        self.stem = ConvNormAct(2 * in_channels, 2 * levels * out_channels, 3, groups=2, **ops)
        self.up_convs = nn.ModuleList(
            [ConvNormAct(2 * len(lv) * out_channels, 2 * len(lv) * out_channels, 3, groups=2 * len(lv), **ops)
             for lv in self.step_levels])

    def forward(self, f_fg: Tensor, f_bg: Tensor) -> List[Tuple[Tensor, Tensor]]:
        c = self.out_channels
        out: List[Optional[Tuple[Tensor, Tensor]]] = [None] * len(self.num_upsamplings)
        levels = list(range(len(self.num_upsamplings)))
        y = self.stem(torch.cat([f_fg, f_bg], dim=1))  # (B, 2 * len(levels) * C, h, w): fg of each level, then bg
        for s in range(len(self.step_levels) + 1):
            n = len(levels)
            for i, lv in enumerate(levels):
                if self.num_upsamplings[lv] == s:
                    out[lv] = (y[:, i * c:(i + 1) * c], y[:, (n + i) * c:(n + i + 1) * c])
            if s == len(self.step_levels):
                break
            nxt = self.step_levels[s]
            k = len(nxt)
            if k < n:
                # cat keeps channels-last; a reshape of the view would copy to NCHW, and later up-samplings run NCHW
                if nxt == levels[:k]:
                    y = torch.cat([y[:, :k * c], y[:, n * c:(n + k) * c]], dim=1)
                else:
                    idx = [levels.index(lv) for lv in nxt]
                    y = torch.cat([y[:, (side * n + i) * c:(side * n + i + 1) * c] for side in (0, 1) for i in idx],
                                  dim=1)
            levels = nxt
            y = self.up_convs[s](F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False))
        return out  # type: ignore[return-value]
