"""TeLU as one Triton kernel on CUDA: one pass over memory where PyTorch's operations take several.

``telu_triton`` computes TeLU(x) = x * tanh(exp(x)) and its slope (all the backward needs) in fp32 for fp32 /
fp16 / bf16 x, the exponent clamped as in the PyTorch form (``activation._TELU_BACKWARD_CLAMP``: equal values,
slope zero-safe in fp16). It runs on dense CUDA tensors with Triton outside ``torch.compile`` (which fuses the
PyTorch form), and on CPU tensors under ``TRITON_INTERPRET=1``. Where Triton cannot build or launch it, it is off
for the process (one warning) and ``telu_triton`` returns None: the caller computes the PyTorch form.
"""
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the package works without Triton: the PyTorch form runs everywhere then
    triton = None

from nnunetv2_meddisseg import environment

__all__ = ["telu_triton", "telu_triton_available"]

_BLOCK = 1024
#: why the kernel is off for this process, None while it is on
_failure: Optional[str] = None
#: where TeLU's slope is exactly 1 (tanh(exp(4)) rounds to 1 in every float dtype); see ``activation``
_CLAMP = 4.0

if triton is not None:
    @triton.jit
    def _telu_kernel(x_ptr, y_ptr, slope_ptr, n, WITH_SLOPE: tl.constexpr, CLAMP: tl.constexpr,
                     BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        xc = tl.minimum(x, CLAMP)
        e = tl.exp(xc)
        t = 1.0 - 2.0 / (tl.exp(2.0 * tl.minimum(e, 20.0)) + 1.0)  # tanh(e), e > 0 (exactly 1 in fp32 from e ~ 9)
        tl.store(y_ptr + offsets, (x * t).to(y_ptr.dtype.element_ty), mask=mask)
        if WITH_SLOPE:
            slope = t + xc * (1.0 - t * t) * e
            tl.store(slope_ptr + offsets, slope.to(slope_ptr.dtype.element_ty), mask=mask)


def _dense(x: Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


def telu_triton_available(x: Tensor) -> bool:
    """Whether :func:`telu_triton` runs for ``x`` (see the module docstring)."""
    if (triton is None or _failure is not None or not _dense(x)
            or x.dtype not in (torch.float32, torch.float16, torch.bfloat16)):
        return False
    if torch.compiler.is_compiling():
        return False
    return x.is_cuda or (x.device.type == "cpu" and environment.TRITON_INTERPRETED)


def telu_triton(x: Tensor, with_slope: bool = False) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """(TeLU(x), slope or None) in x's shape, dtype and memory format; None where Triton failed to build or launch."""
    global _failure
    y = torch.empty_like(x)
    slope = torch.empty_like(x) if with_slope else y
    n = x.numel()
    if n:
        try:
            _telu_kernel[(triton.cdiv(n, _BLOCK),)](x, y, slope, n, WITH_SLOPE=with_slope, CLAMP=_CLAMP, BLOCK=_BLOCK)
        except Exception as error:
            if not (type(error).__module__ or "").startswith("triton"):
                raise
            _failure = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
            warnings.warn(f"the TeLU Triton kernel failed on this GPU ({_failure}); PyTorch's operations compute "
                          f"TeLU instead (same values, slower)", RuntimeWarning, stacklevel=2)
            return None
    return y, (slope if with_slope else None)
