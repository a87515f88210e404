"""Contrast-driven feature aggregation (CDFA, after ConDSeg) and the guidance pyramid feeding it.

The window attention has three forms with equal results up to rounding, chosen by the block's ``form``
(None, the default: by the input's device; ``blocks.device_forms``):

- the *fused form* (CUDA with Triton): the identity below computed by two Triton kernels registered as
  custom ops (``blocks.cdfa_kernels``): logits (B, heads * k^4, H, W) from the 1x1 convolution ->
  per-offset weights D (B, heads, (2k-1)^2, H, W) (softmax and sum per offset fused) -> the values
  (B, dim, H, W) summed over the offsets, without any intermediate of k*k times the values' size;
- the *shifted form* (the CPU, and CUDA without Triton) does not materialise the k x k windows either:
  the weights of all windows that touch a pixel are first summed per displacement between the written
  pixel and the read pixel (:func:`window_displacement_weights`), then the values are accumulated from
  (2k-1)^2 shifted views (:func:`displacement_sum`). Both are linear maps with hand-written backward
  passes (``blocks.cdfa_shifted``). Its hundreds of small in-place operations on views are fast on a
  CPU (no large intermediates);
- the *graph form* (what the ONNX exporter traces) computes the shifted form's identity with whole-tensor
  operations on padded copies and no in-place writes (``blocks.cdfa_graph``).

The identity: per head, out(q) = sum_d D_d(q) * v(q + d) over the offsets d in [-(k-1), k-1]^2 (zero
outside the image), with D_d(q) = sum_{i, j: off_j - off_i = d} A_{q - off_i}[i, j].

The first implementation (unfold -> per-pixel matmul -> fold, with Linear layers on channel-last
views) lives with the tests (``tests/blocks/reference_impls.py``), which check the forms against it.
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

__all__ = [
    "ContrastDrivenAggregation",
    "PointwiseLinear",
    "ContrastGuidancePyramid",
    "window_displacement_weights",
    "displacement_sum",
]



def _is_triton_error(error: BaseException) -> bool:
    """Whether ``error`` comes from Triton (building or launching a kernel)."""
    return any((type(e).__module__ or "").startswith("triton") for e in (error, error.__cause__) if e is not None)


def _fp16_autocast(device_type: str) -> bool:
    """Whether autocast to fp16 is active for ``device_type`` here (never on the meta device, which has no
    autocast: torch refuses the question there)."""
    return (device_type != "meta" and torch.is_autocast_enabled(device_type)
            and torch.get_autocast_dtype(device_type) == torch.float16)


def _at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in fp32 if it is in a lower precision (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class ContrastDrivenAggregation(nn.Module):
    """Window attention whose weights are generated from foreground, then background guidance.

    Per pixel p, a Linear layer on the guidance feature g(p) gives logits A(p) of shape
    (num_heads, k*k, k*k); A = softmax(A * head_dim**-0.5) over the last axis. For the k x k window
    around p (positions i, j, zero padding outside the image), head h writes to the pixel at window
    position i the value sum_j A[h, i, j] * v_h(p + offset_j); the contributions of all windows are
    summed (fold) and a Linear projection follows. This is applied first with the foreground
    guidance on v = Linear(x), then with the background guidance directly on that result (the same
    projection after both).
    Input and output each pass two Conv3x3-Norm-act blocks. Under fp16 autocast, everything from the
    value projection to the first output block is computed in fp32 (see ``forward``).

    ``form`` is the implementation form of the window attention (``blocks.device_forms``): None chooses by the
    input's device, else one of ``device_forms.FORMS`` (or the aliases ``"cuda"``, ``"cpu"``) runs on any device.
    It can be set afterwards (``block.form = ...``, or ``device_forms.set_implementation_form`` on a network).

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
        """The implementation form this block runs (one of ``device_forms.FORMS``), None: by the input's device."""
        return self._form

    @form.setter
    def form(self, form: Optional[str]) -> None:
        self._form = resolve_form(form)

    @staticmethod
    def _pointwise(layer: nn.Module, x: Tensor) -> Tensor:
        """Apply ``layer`` (a Linear or a :class:`PointwiseLinear`) over the channel axis as a 1x1 convolution:
        (B, C, H, W) -> (B, C_out, H, W)."""
        weight = layer.weight if layer.weight.ndim == 4 else layer.weight.view(*layer.weight.shape, 1, 1)
        return F.conv2d(x, weight, layer.bias)

    def window_weights(self, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """guidance: (B, dim, H, W) -> softmaxed weights (B, heads, k*k (i), k*k (j), H, W)."""
        b, _, h, w = guidance.shape
        window = self.kernel_size * self.kernel_size
        logits = self._pointwise(layer, guidance).view(b, self.num_heads, window, window, h, w)
        return torch.softmax(logits.mul_(self.scale), dim=3)

    def window_attention(self, values: Tensor, weights: Tensor) -> Tensor:
        """values: (B, dim, H, W), weights: (B, heads, k*k, k*k, H, W) -> projected (B, dim, H, W).

        Equal to unfolding the values into k x k windows (zero padding), applying each pixel's
        (k*k, k*k) weights per head, folding the windows back (overlaps summed) and projecting, but
        without materialising the windows (see :func:`window_displacement_weights`).
        """
        out = displacement_sum(values, window_displacement_weights(weights, self.kernel_size))
        return self._pointwise(self.proj, out)

    def window_attention_fused(self, values: Tensor, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """The fused form of ``window_attention(values, window_weights(guidance, layer))``.

        values, guidance: (B, dim, H, W) -> projected (B, dim, H, W). The logits of the 1x1 convolution
        (B, heads * k^4, H, W) -> per-offset weights (B, heads, (2k-1)^2, H, W) (fp32) -> the values summed
        over the offsets (B, dim, H, W), each step one Triton kernel (:mod:`blocks.cdfa_kernels`).
        """
        logits = self._pointwise(layer, guidance)
        weights = window_offset_weights(logits, self.scale, self.num_heads, self.kernel_size)
        return self._pointwise(self.proj, offset_aggregate(values, weights))

    def window_attention_graph(self, values: Tensor, guidance: Tensor, layer: nn.Linear) -> Tensor:
        """The graph form of ``window_attention(values, window_weights(guidance, layer))``: no in-place
        operation, so that a tracer (the ONNX exporter) records every step.

        values, guidance: (B, dim, H, W) -> projected (B, dim, H, W)
        """
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
        # Nothing normalises the features from the value projection to the first output convolution's
        # norm: value, projection and that convolution are scale-invariant under the norm, so their
        # weights grow freely in training (Adam without weight decay) and so does the convolution's output
        # (55 -> 18,800 in 775 steps of benchmarks/amp_probe.py, still rising). Under fp16 autocast it
        # can pass fp16's largest value (65504), after which every step would be skipped; so under fp16
        # autocast this stretch runs in fp32. bf16 has fp32's exponent range, so bf16 autocast (and no
        # autocast) runs it unchanged.
        if _fp16_autocast(x.device.type):
            with torch.autocast(device_type=x.device.type, enabled=False):
                x = self._aggregate(_at_least_fp32(x), _at_least_fp32(fg), _at_least_fp32(bg))
        else:
            x = self._aggregate(x, fg, bg)
        return self.output_convs[1:](x)


class ContrastGuidancePyramid(nn.Module):
    """f_fg, f_bg at the deepest level -> one (fg, bg) guidance pair per CDFA level.

    ``num_upsamplings[l]`` is the number of x2 steps from the deepest level to level l
    (default (3, 2, 1, 0): levels 1..4 at H/2, H/4, H/8, H/16 from H/16). fg and bg have their own
    branches at every level: CBT3x3, then ``num_upsamplings[l]`` x [bilinear x2, CBT3x3].

    All branches run as one: the stem is one grouped CBT3x3 (2 groups: fg, bg; output channels
    [fg of every level, bg of every level]), and step s (every branch's s-th up-sampling and CBT3x3)
    one bilinear x2 and one grouped CBT3x3 over the branches of the levels with more than s steps
    (``2 * len(levels)`` groups). Per channel this is the same function as separate branches (a group of a
    grouped convolution sees only its branch's channels; norm and activation are per channel), in a
    handful of operations.

    f_fg, f_bg: (B, in_channels, h, w) -> [(fg_l, bg_l): (B, out_channels, h * 2**n_l, w * 2**n_l)] for each
    level (fg_l, bg_l: channel slices of one tensor)
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
                # channel slices joined by cat, which keeps the memory format (a reshape of a channels-last
                # view would copy it into NCHW, and every later up-sampling would run NCHW)
                if nxt == levels[:k]:
                    y = torch.cat([y[:, :k * c], y[:, n * c:(n + k) * c]], dim=1)
                else:
                    idx = [levels.index(lv) for lv in nxt]
                    y = torch.cat([y[:, (side * n + i) * c:(side * n + i + 1) * c] for side in (0, 1) for i in idx],
                                  dim=1)
            levels = nxt
            y = self.up_convs[s](F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False))
        return out  # type: ignore[return-value]
