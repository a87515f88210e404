"""The fused form of CDFA's window attention (identity in ``blocks.cdfa``): two Triton kernels with backward
kernels, as custom ops (namespace ``meddisseg``) for both eager mode and ``torch.compile``.

- ``window_offset_weights``: logits -> D, A formed in fp32 and gathered per output pixel (no atomics); the
  backward recomputes A from the logits, the only tensor saved;
- ``offset_aggregate``: values, D -> out, accumulated in fp32; a program takes a block of pixels by a block of
  one head's channels (contiguous loads in channels_last).

Any memory layout works (strides go to the kernels); outputs shaped like an input get its layout, D is
contiguous. Triton is imported on the first launch, so this module imports without it. With
``TRITON_INTERPRET=1`` set before Triton's first import, the kernels run on CPU tensors (slow: for tests).
"""
import contextlib
import functools
import importlib.util
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from nnunetv2_meddisseg import environment

__all__ = ["fused_cdfa_available", "triton_interpreted", "window_offset_weights", "offset_aggregate",
           "SUPPORTED_DTYPES"]

#: input dtypes the kernels accept (they compute in fp32)
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TRITON_FOUND = importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (kernels on any device's tensors)."""
    return environment.TRITON_INTERPRETED


def fused_cdfa_available(x: Tensor) -> bool:
    """Whether the fused ops can run on ``x``: Triton installed and ``x`` on CUDA, or ``TRITON_INTERPRET=1``."""
    return _TRITON_FOUND and (x.device.type == "cuda" or triton_interpreted())


def _new_output(like: Tensor, shape: Optional[Sequence[int]] = None, dtype: Optional[torch.dtype] = None) -> Tensor:
    """``torch.empty_like(like)``, or a contiguous ``shape`` on ``like``'s device; a kernel writes every element."""
    if shape is None:
        return torch.empty_like(like, dtype=dtype)
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device)


@functools.lru_cache(maxsize=None)
def _kernels() -> Tuple[Callable, ...]:
    """The Triton kernels, defined on first use. Offsets d are indexed ``(dy + k - 1) * (2k - 1) + (dx + k - 1)``."""
    import triton
    import triton.language as tl

    @triton.jit
    def offset_weights_fwd(logits_ptr, d_ptr, scale, H, W,
                           sl_b, sl_c, sl_y, sl_x, sd_b, sd_h, sd_d, sd_y, sd_x,
                           HEADS: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
        # program: BLOCK_P pixels q of one (batch, head); all offsets d as columns of one tile
        KK: tl.constexpr = K * K
        S: tl.constexpr = 2 * K - 1
        R: tl.constexpr = K // 2
        b = (tl.program_id(1) // HEADS).to(tl.int64)
        h = tl.program_id(1) % HEADS
        q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        q_ok = q < H * W
        qy, qx = q // W, q % W
        d = tl.arange(0, BLOCK_D)
        dy, dx = d // S, d % S
        acc = tl.zeros((BLOCK_P, BLOCK_D), dtype=tl.float32)
        for i in tl.static_range(KK):
            iy = i // K
            ix = i % K
            # the window centred at p = q - off_i; its row i, loaded so that column d holds j with off_j - off_i = d
            py, px = qy - (iy - R), qx - (ix - R)
            p_ok = q_ok & (py >= 0) & (py < H) & (px >= 0) & (px < W)
            jy, jx = dy - (K - 1) + iy, dx - (K - 1) + ix
            j_ok = (d < S * S) & (jy >= 0) & (jy < K) & (jx >= 0) & (jx < K)
            mask = p_ok[:, None] & j_ok[None, :]
            channel = (h * KK + i) * KK + jy * K + jx
            ptrs = logits_ptr + b * sl_b + channel[None, :] * sl_c + py[:, None] * sl_y + px[:, None] * sl_x
            x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x * scale, float("-inf"))
            m = tl.where(p_ok, tl.max(x, axis=1), 0.0)
            e = tl.where(mask, tl.exp(x - m[:, None]), 0.0)
            total = tl.where(p_ok, tl.sum(e, axis=1), 1.0)
            acc += e / total[:, None]
        ptrs = d_ptr + b * sd_b + h * sd_h + d[None, :] * sd_d + qy[:, None] * sd_y + qx[:, None] * sd_x
        tl.store(ptrs, acc, mask=q_ok[:, None] & (d[None, :] < S * S))

    @triton.jit
    def offset_weights_bwd(logits_ptr, gd_ptr, gl_ptr, scale, H, W,
                           sl_b, sl_c, sl_y, sl_x, sg_b, sg_h, sg_d, sg_y, sg_x, so_b, so_c, so_y, so_x,
                           HEADS: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr):
        # program: BLOCK_P window centres p of one (batch, head); per row i, the k*k logits j as columns
        KK: tl.constexpr = K * K
        S: tl.constexpr = 2 * K - 1
        R: tl.constexpr = K // 2
        b = (tl.program_id(1) // HEADS).to(tl.int64)
        h = tl.program_id(1) % HEADS
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        p_ok = p < H * W
        py, px = p // W, p % W
        j = tl.arange(0, BLOCK_J)
        j_ok = j < KK
        jy, jx = j // K, j % K
        for i in tl.static_range(KK):
            iy = i // K
            ix = i % K
            mask = p_ok[:, None] & j_ok[None, :]
            channel = (h * KK + i) * KK + j
            ptrs = logits_ptr + b * sl_b + channel[None, :] * sl_c + py[:, None] * sl_y + px[:, None] * sl_x
            x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x * scale, float("-inf"))
            m = tl.where(p_ok, tl.max(x, axis=1), 0.0)
            e = tl.where(mask, tl.exp(x - m[:, None]), 0.0)
            a = e / tl.where(p_ok, tl.sum(e, axis=1), 1.0)[:, None]
            # grad of A_p[i, j]: grad_D at q = p + off_i, offset off_j - off_i (zero where q is outside)
            qy, qx = py + (iy - R), px + (ix - R)
            q_ok = p_ok & (qy >= 0) & (qy < H) & (qx >= 0) & (qx < W)
            d = (jy - iy + K - 1) * S + (jx - ix + K - 1)
            ptrs = gd_ptr + b * sg_b + h * sg_h + d[None, :] * sg_d + qy[:, None] * sg_y + qx[:, None] * sg_x
            ga = tl.load(ptrs, mask=q_ok[:, None] & j_ok[None, :], other=0.0).to(tl.float32)
            dot = tl.sum(a * ga, axis=1)
            grad = scale * a * (ga - dot[:, None])
            ptrs = gl_ptr + b * so_b + channel[None, :] * so_c + py[:, None] * so_y + px[:, None] * so_x
            tl.store(ptrs, grad.to(gl_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def aggregate(v_ptr, d_ptr, out_ptr, H, W, HEAD_DIM,
                  sv_b, sv_c, sv_y, sv_x, sd_b, sd_h, sd_d, sd_y, sd_x, so_b, so_c, so_y, so_x,
                  HEADS: tl.constexpr, S: tl.constexpr, TRANSPOSED: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        # out(q, c) = sum_d D(q, d) v(q + d, c); TRANSPOSED: out(p, c) = sum_d D(p - d, d) v(p - d, c)
        # program: BLOCK_P pixels x BLOCK_C channels of one head of one image
        C: tl.constexpr = S // 2
        b = (tl.program_id(1) // HEADS).to(tl.int64)
        h = tl.program_id(1) % HEADS
        q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        q_ok = q < H * W
        qy, qx = q // W, q % W
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        c_ok = c < HEAD_DIM
        channel = h * HEAD_DIM + c
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        for d in tl.static_range(S * S):
            ddy = d // S - C
            ddx = d % S - C
            if TRANSPOSED:
                ry, rx = qy - ddy, qx - ddx
            else:
                ry, rx = qy + ddy, qx + ddx
            r_ok = q_ok & (ry >= 0) & (ry < H) & (rx >= 0) & (rx < W)
            if TRANSPOSED:
                wgt = tl.load(d_ptr + b * sd_b + h * sd_h + d * sd_d + ry * sd_y + rx * sd_x, mask=r_ok, other=0.0)
            else:
                wgt = tl.load(d_ptr + b * sd_b + h * sd_h + d * sd_d + qy * sd_y + qx * sd_x, mask=r_ok, other=0.0)
            ptrs = v_ptr + b * sv_b + channel[None, :] * sv_c + ry[:, None] * sv_y + rx[:, None] * sv_x
            val = tl.load(ptrs, mask=r_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
            acc += wgt.to(tl.float32)[:, None] * val
        ptrs = out_ptr + b * so_b + channel[None, :] * so_c + qy[:, None] * so_y + qx[:, None] * so_x
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=q_ok[:, None] & c_ok[None, :])

    @triton.jit
    def aggregate_grad_d(g_ptr, v_ptr, gd_ptr, H, W, HEAD_DIM,
                         sg_b, sg_c, sg_y, sg_x, sv_b, sv_c, sv_y, sv_x, so_b, so_h, so_d, so_y, so_x,
                         HEADS: tl.constexpr, S: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                         ONE_BLOCK: tl.constexpr):
        # grad_D(q, d) = sum_{c of the head} g(q, c) v(q + d, c); program: BLOCK_P pixels of one head of one image
        C: tl.constexpr = S // 2
        b = (tl.program_id(1) // HEADS).to(tl.int64)
        h = tl.program_id(1) % HEADS
        q = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        q_ok = q < H * W
        qy, qx = q // W, q % W
        cb = tl.arange(0, BLOCK_C)
        g_first = tl.load(g_ptr + b * sg_b + (h * HEAD_DIM + cb)[None, :] * sg_c + qy[:, None] * sg_y
                          + qx[:, None] * sg_x, mask=q_ok[:, None] & (cb < HEAD_DIM)[None, :], other=0.0)
        g_first = g_first.to(tl.float32)
        for d in tl.static_range(S * S):
            ry, rx = qy + (d // S - C), qx + (d % S - C)
            r_ok = q_ok & (ry >= 0) & (ry < H) & (rx >= 0) & (rx < W)
            if ONE_BLOCK:
                ptrs = v_ptr + b * sv_b + (h * HEAD_DIM + cb)[None, :] * sv_c + ry[:, None] * sv_y + rx[:, None] * sv_x
                val = tl.load(ptrs, mask=r_ok[:, None] & (cb < HEAD_DIM)[None, :], other=0.0).to(tl.float32)
                total = tl.sum(g_first * val, axis=1)
            else:
                total = tl.zeros((BLOCK_P,), dtype=tl.float32)
                for c0 in range(0, HEAD_DIM, BLOCK_C):
                    c = c0 + cb
                    c_ok = c < HEAD_DIM
                    channel = h * HEAD_DIM + c
                    g = tl.load(g_ptr + b * sg_b + channel[None, :] * sg_c + qy[:, None] * sg_y + qx[:, None] * sg_x,
                                mask=q_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
                    val = tl.load(v_ptr + b * sv_b + channel[None, :] * sv_c + ry[:, None] * sv_y + rx[:, None] * sv_x,
                                  mask=r_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
                    total += tl.sum(g * val, axis=1)
            tl.store(gd_ptr + b * so_b + h * so_h + d * so_d + qy * so_y + qx * so_x,
                     total.to(gd_ptr.dtype.element_ty), mask=q_ok)

    return offset_weights_fwd, offset_weights_bwd, aggregate, aggregate_grad_d


def _kernel(index: int) -> Callable:
    return _kernels()[index]


def _on_device(t: Tensor) -> contextlib.AbstractContextManager:
    """Launches on ``t``'s CUDA device (Triton launches on the current one)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


#: pixels per program (the fp32 tiles are BLOCK_P x 32 for k = 3)
_BLOCK_P = 64
#: most channels per program (a head's; more are split over programs / loop iterations)
_MAX_BLOCK_C = 64


def _check_dtype(name: str, t: Tensor) -> None:
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be one of {[str(d) for d in SUPPORTED_DTYPES]}, got {t.dtype}")


# --- window_offset_weights ---

@torch.library.custom_op("meddisseg::window_offset_weights", mutates_args=())
def _window_offset_weights(logits: Tensor, scale: float, num_heads: int, kernel_size: int) -> Tensor:
    b, _, h, w = logits.shape
    span = 2 * kernel_size - 1
    out = _new_output(logits, (b, num_heads, span * span, h, w), torch.float32)
    if out.numel():
        grid = (_cdiv(h * w, _BLOCK_P), b * num_heads)
        with _on_device(logits):
            _kernel(0)[grid](logits, out, float(scale), h, w, *logits.stride(), *out.stride(),
                             HEADS=num_heads, K=kernel_size, BLOCK_P=_BLOCK_P, BLOCK_D=_next_power_of_2(span * span))
    return out


@_window_offset_weights.register_fake
def _(logits: Tensor, scale: float, num_heads: int, kernel_size: int) -> Tensor:
    b, _, h, w = logits.shape
    return logits.new_empty((b, num_heads, (2 * kernel_size - 1) ** 2, h, w), dtype=torch.float32)


@torch.library.custom_op("meddisseg::window_offset_weights_backward", mutates_args=())
def _window_offset_weights_backward(grad: Tensor, logits: Tensor, scale: float, num_heads: int,
                                    kernel_size: int) -> Tensor:
    b, _, h, w = logits.shape
    out = _new_output(logits)
    if out.numel():
        grid = (_cdiv(h * w, _BLOCK_P), b * num_heads)
        with _on_device(logits):
            _kernel(1)[grid](logits, grad, out, float(scale), h, w, *logits.stride(), *grad.stride(), *out.stride(),
                             HEADS=num_heads, K=kernel_size, BLOCK_P=_BLOCK_P,
                             BLOCK_J=_next_power_of_2(kernel_size ** 2))
    return out


@_window_offset_weights_backward.register_fake
def _(grad: Tensor, logits: Tensor, scale: float, num_heads: int, kernel_size: int) -> Tensor:
    return torch.empty_like(logits)


def _window_offset_weights_setup(ctx, inputs, output) -> None:
    logits, scale, num_heads, kernel_size = inputs
    ctx.save_for_backward(logits)
    ctx.args = (scale, num_heads, kernel_size)


def _window_offset_weights_grad(ctx, grad: Tensor):
    (logits,) = ctx.saved_tensors
    return torch.ops.meddisseg.window_offset_weights_backward(grad, logits, *ctx.args), None, None, None


_window_offset_weights.register_autograd(_window_offset_weights_grad, setup_context=_window_offset_weights_setup)


def window_offset_weights(logits: Tensor, scale: float, num_heads: int, kernel_size: int) -> Tensor:
    """Per-offset window weights D from logits (B, heads * k^4, H, W) (fp32 / fp16 / bf16, any layout), channel
    ``(head * k*k + i) * k*k + j``, ``A_p = softmax_j(scale * logits_p[head, i, j])`` -> D: (B, heads, (2k-1)^2, H, W)
    in fp32, offset index ``(dy + k - 1) * (2k - 1) + dx + k - 1``; windows centred outside the image add nothing."""
    if kernel_size < 1 or kernel_size % 2 != 1:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    if logits.ndim != 4 or num_heads < 1 or logits.shape[1] != num_heads * kernel_size ** 4:
        raise ValueError(f"logits must be (B, {num_heads} * {kernel_size ** 4}, H, W), got {tuple(logits.shape)}")
    _check_dtype("logits", logits)
    return torch.ops.meddisseg.window_offset_weights(logits, float(scale), int(num_heads), int(kernel_size))


# --- offset_aggregate ---

def _aggregate_geometry(values: Tensor, weights: Tensor) -> Tuple[int, int, int, int, int, int, int]:
    """(B, H, W, heads, S, head_dim, the channel block) of an aggregation of ``values`` with ``weights``."""
    b, c, h, w = values.shape
    heads, span = weights.shape[1], int(round(weights.shape[2] ** 0.5))
    head_dim = c // heads
    return b, h, w, heads, span, head_dim, min(_next_power_of_2(head_dim), _MAX_BLOCK_C)


def _aggregate_launch(values: Tensor, weights: Tensor, out: Tensor, transposed: bool) -> None:
    b, h, w, heads, span, head_dim, block_c = _aggregate_geometry(values, weights)
    grid = (_cdiv(h * w, _BLOCK_P), b * heads, _cdiv(head_dim, block_c))
    with _on_device(values):
        _kernel(2)[grid](values, weights, out, h, w, head_dim, *values.stride(), *weights.stride(), *out.stride(),
                         HEADS=heads, S=span, TRANSPOSED=transposed, BLOCK_P=_BLOCK_P, BLOCK_C=block_c)


@torch.library.custom_op("meddisseg::offset_aggregate", mutates_args=())
def _offset_aggregate(values: Tensor, weights: Tensor) -> Tensor:
    out = _new_output(values)
    if out.numel():
        _aggregate_launch(values, weights, out, transposed=False)
    return out


@_offset_aggregate.register_fake
def _(values: Tensor, weights: Tensor) -> Tensor:
    return torch.empty_like(values)


@torch.library.custom_op("meddisseg::offset_aggregate_backward", mutates_args=())
def _offset_aggregate_backward(grad: Tensor, values: Tensor, weights: Tensor) -> Tuple[Tensor, Tensor]:
    grad_values = _new_output(values)
    grad_weights = _new_output(weights)
    if grad_values.numel():
        _aggregate_launch(grad, weights, grad_values, transposed=True)
        b, h, w, heads, span, head_dim, block_c = _aggregate_geometry(values, weights)
        grid = (_cdiv(h * w, _BLOCK_P), b * heads)
        with _on_device(values):
            _kernel(3)[grid](grad, values, grad_weights, h, w, head_dim, *grad.stride(), *values.stride(),
                             *grad_weights.stride(), HEADS=heads, S=span, BLOCK_P=_BLOCK_P, BLOCK_C=block_c,
                             ONE_BLOCK=block_c >= head_dim)
    elif grad_weights.numel():
        grad_weights.zero_()
    return grad_values, grad_weights


@_offset_aggregate_backward.register_fake
def _(grad: Tensor, values: Tensor, weights: Tensor) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(values), torch.empty_like(weights)


def _offset_aggregate_setup(ctx, inputs, output) -> None:
    values, weights = inputs
    ctx.save_for_backward(values, weights)


def _offset_aggregate_grad(ctx, grad: Tensor):
    values, weights = ctx.saved_tensors
    return torch.ops.meddisseg.offset_aggregate_backward(grad, values, weights)


_offset_aggregate.register_autograd(_offset_aggregate_grad, setup_context=_offset_aggregate_setup)


def offset_aggregate(values: Tensor, weights: Tensor) -> Tensor:
    """out(q, c) = sum_d D(q, head(c), d) * v(q + d, c), zero outside the image, accumulated in fp32, in the values'
    dtype and layout. values: (B, heads * head_dim, H, W) (fp32 / fp16 / bf16, any layout), D: (B, heads, S*S, H, W),
    S odd, index ``(dy + S//2) * S + dx + S//2`` (fp32 for full precision)."""
    if weights.ndim != 5:
        raise ValueError(f"weights must be (B, heads, S*S, H, W), got {tuple(weights.shape)}")
    b, heads, offsets, h, w = weights.shape
    span = int(round(offsets ** 0.5))
    if span * span != offsets or span % 2 != 1:
        raise ValueError(f"weights must be (B, heads, S*S, H, W) with S odd, got {tuple(weights.shape)}")
    if values.ndim != 4 or values.shape[0] != b or tuple(values.shape[2:]) != (h, w) or values.shape[1] % heads:
        raise ValueError(f"values {tuple(values.shape)} do not match weights {tuple(weights.shape)}")
    _check_dtype("values", values)
    _check_dtype("weights", weights)
    return torch.ops.meddisseg.offset_aggregate(values, weights)
