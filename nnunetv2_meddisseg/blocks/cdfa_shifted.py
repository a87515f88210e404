"""The shifted form of CDFA's window attention: two linear maps with hand-written backward passes.

Neither materialises the k x k windows; their many small in-place ops on views are fast on a CPU.
"""
from typing import Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from nnunetv2_meddisseg.blocks.conv import memory_format_of

__all__ = ["window_displacement_weights", "displacement_sum"]


def _overlap(size: int, shift: int) -> Tuple[slice, slice]:
    """(dst, src) slices of range(size) with src = dst + shift, both inside the range (empty if none)."""
    lo, hi = max(0, -shift), min(size, size - shift)
    if hi <= lo:
        return slice(0, 0), slice(0, 0)
    return slice(lo, hi), slice(lo + shift, hi + shift)


class _WindowDisplacementWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights: Tensor, kernel_size: int) -> Tensor:
        b, heads, _, _, h, w = weights.shape
        k, r = kernel_size, kernel_size // 2
        ctx.kernel_size = kernel_size
        a = weights.view(b, heads, k, k, k, k, h, w)
        out = weights.new_zeros(b, heads, 2 * k - 1, 2 * k - 1, h, w)
        for iy in range(k):
            dst_y, src_y = _overlap(h, r - iy)
            for ix in range(k):
                dst_x, src_x = _overlap(w, r - ix)
                # window position i = (iy, ix), all j: displacements (jy - iy, jx - ix), a k x k block
                out[:, :, k - 1 - iy:2 * k - 1 - iy, k - 1 - ix:2 * k - 1 - ix, dst_y, dst_x] += \
                    a[:, :, iy, ix, :, :, src_y, src_x]
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
        b, heads, _, _, h, w = grad.shape
        k, r = ctx.kernel_size, ctx.kernel_size // 2
        grad_a = grad.new_zeros(b, heads, k, k, k, k, h, w)
        for iy in range(k):
            dst_y, src_y = _overlap(h, r - iy)
            for ix in range(k):
                dst_x, src_x = _overlap(w, r - ix)
                grad_a[:, :, iy, ix, :, :, src_y, src_x] = \
                    grad[:, :, k - 1 - iy:2 * k - 1 - iy, k - 1 - ix:2 * k - 1 - ix, dst_y, dst_x]
        return grad_a.view(b, heads, k * k, k * k, h, w), None


def window_displacement_weights(weights: Tensor, kernel_size: int) -> Tensor:
    """Sum the window weights per displacement between written and read pixel.

    With off_i = (iy - k//2, ix - k//2), the window centred at p writes ``sum_j A_p[i, j] v(p + off_j)`` to
    q = p + off_i, so q reads v(q + delta), delta = off_j - off_i in [-(k-1), k-1]^2, with total weight
    ``D_delta(q) = sum_{i, j: off_j - off_i = delta} A_{q - off_i}[i, j]`` (windows centred outside contribute 0).

    weights: (B, heads, k*k (i), k*k (j), H, W) -> D: (B, heads, 2k-1, 2k-1, H, W), index delta + k - 1
    """
    if weights.ndim != 6 or weights.shape[2] != kernel_size ** 2 or weights.shape[3] != kernel_size ** 2:
        raise ValueError(f"weights must be (B, heads, {kernel_size ** 2}, {kernel_size ** 2}, H, W), "
                         f"got {tuple(weights.shape)}")
    return _WindowDisplacementWeights.apply(weights.contiguous(), kernel_size)


class _DisplacementSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, displacement: Tensor) -> Tensor:
        b, heads, span, _, h, w = displacement.shape
        dtype = torch.promote_types(values.dtype, displacement.dtype)
        v = values.view(b, heads, -1, h, w).to(dtype)
        d = displacement.to(dtype).unsqueeze(4)  # (B, heads, span, span, 1, H, W)
        ctx.save_for_backward(v, d)
        ctx.dtypes = (values.dtype, displacement.dtype)
        c = span // 2
        out = v * d[:, :, c, c]
        for dy in range(span):
            dst_y, src_y = _overlap(h, dy - c)
            for dx in range(span):
                if dy == c and dx == c:
                    continue
                dst_x, src_x = _overlap(w, dx - c)
                out[..., dst_y, dst_x].addcmul_(v[..., src_y, src_x], d[:, :, dy, dx, :, dst_y, dst_x])
        return out.view(values.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, Tensor]:
        v, d = ctx.saved_tensors
        b, heads, span, _, _, h, w = d.shape
        c = span // 2
        g = grad.to(v.dtype).reshape(v.shape)
        grad_v = g * d[:, :, c, c]
        grad_d = torch.zeros_like(d.squeeze(4))
        product = torch.empty_like(v)
        for dy in range(span):
            dst_y, src_y = _overlap(h, dy - c)
            for dx in range(span):
                dst_x, src_x = _overlap(w, dx - c)
                gd, vs = g[..., dst_y, dst_x], v[..., src_y, src_x]
                if dy != c or dx != c:
                    grad_v[..., src_y, src_x].addcmul_(gd, d[:, :, dy, dx, :, dst_y, dst_x])
                # copy + in-place multiply into the strided view (torch.compile cannot trace mul(out=view))
                part = product[..., dst_y, dst_x].copy_(gd).mul_(vs)
                grad_d[:, :, dy, dx, dst_y, dst_x] = part.sum(dim=2)
        values_dtype, displacement_dtype = ctx.dtypes
        return grad_v.view(grad.shape).to(values_dtype), grad_d.to(displacement_dtype)


def displacement_sum(values: Tensor, displacement: Tensor) -> Tensor:
    """out(q) = sum_delta D_delta(q) * v(q + delta) per head, zero outside the image, in the inputs' promoted dtype;
    values: (B, heads * head_dim, H, W), displacement: (B, heads, S, S, H, W), S odd, index delta + S // 2."""
    if displacement.ndim != 6 or displacement.shape[2] != displacement.shape[3] or displacement.shape[2] % 2 != 1:
        raise ValueError(f"displacement must be (B, heads, S, S, H, W) with S odd, got {tuple(displacement.shape)}")
    b, heads, _, _, h, w = displacement.shape
    if values.ndim != 4 or values.shape[0] != b or values.shape[2:] != (h, w) or values.shape[1] % heads:
        raise ValueError(f"values {tuple(values.shape)} do not match displacement weights {tuple(displacement.shape)}")
    out = _DisplacementSum.apply(values.contiguous(), displacement.contiguous())
    return out.contiguous(memory_format=memory_format_of(values))  # channels-last in, channels-last out
