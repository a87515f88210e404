"""Activations used by Med-DisSeg: TeLU and a name -> class lookup for the ``activation`` option."""
from typing import Tuple, Type

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from nnunetv2_meddisseg.blocks.telu_kernels import telu_triton, telu_triton_available

__all__ = ["TELU_EXP_CLAMP", "telu", "TeLU", "get_activation", "attention_sigmoid"]

#: Upper clamp of the exponent input: tanh(exp(x)) == 1 exactly (even in float64) for x > ~3.7, so it changes nothing,
#: and exp(10) ~ 2.2e4 is finite in fp16; unclamped, exp(x) overflows for x > ~11 and autograd's 0 (tanh') * inf is NaN.
TELU_EXP_CLAMP = 10.0
#: where TeLU's slope is exactly 1 in every float dtype (tanh(exp(4)) rounds to 1 even in float64)
_TELU_BACKWARD_CLAMP = 4.0


def _telu_forward(x: Tensor) -> Tensor:
    # No clamp for the value: tanh(inf) = 1 = tanh(exp(10)) bit for bit; the clamp only matters for the gradient.
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        # CPU exp and tanh are slower in bf16 (TeLU: 30 % of a bf16 forward); fp32, rounded once, is faster, more exact
        return _telu_forward(x.float()).to(torch.bfloat16)
    y = torch.exp(x)
    y.tanh_()
    return y.mul_(x)


def _telu_and_slope(x: Tensor) -> Tuple[Tensor, Tensor]:
    """TeLU(x) and its derivative at x (same shape and dtype), in six operations.

    d/dx [x tanh(e^x)] = tanh(e^x) + x (1 - tanh^2(e^x)) e^x. Above x = 4, tanh(e^x) rounds to 1 in every float dtype,
    so x is clamped at 4 in the exponent: the value is unchanged and the slope's second term exactly 0, as autograd's.
    (1 - t^2) multiplies the clamped x before e^x, so no intermediate overflows fp16."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        # as in _telu_forward: faster and more exact in fp32 on the CPU
        y, slope = _telu_and_slope(x.float())
        return y.to(torch.bfloat16), slope.to(torch.bfloat16)
    xc = x.clamp(max=_TELU_BACKWARD_CLAMP)
    e = torch.exp(xc)
    t = torch.tanh(e)
    return t * x, torch.addcmul(t, torch.ops.aten.tanh_backward(xc, t), e)


class _TeLUFunction(torch.autograd.Function):
    """TeLU whose forward also computes the slope, the only tensor saved (autograd would also keep exp(x) and
    tanh(exp(x))): the backward is one multiplication, seven operations in all against autograd's ten."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        fast = telu_triton(x, with_slope=True) if telu_triton_available(x) else None
        y, slope = fast if fast is not None else _telu_and_slope(x)
        ctx.save_for_backward(slope)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (slope,) = ctx.saved_tensors
        return grad * slope


def telu(x: Tensor) -> Tensor:
    """TeLU(x) = x * tanh(exp(x)), safe in fp32 / fp16 / bf16; one Triton kernel on CUDA outside torch.compile."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _TeLUFunction.apply(x)
    fast = telu_triton(x) if telu_triton_available(x) else None
    return fast[0] if fast is not None else _telu_forward(x)


class TeLU(nn.Module):
    """Module form of ``telu`` (Fernandez & Mali, "TeLU activation function")."""

    def __init__(self, inplace: bool = False) -> None:
        # ``inplace`` is ignored; accepted so TeLU can stand in for nn.ReLU(inplace=...)
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return telu(x)


_ACTIVATIONS = {"telu": TeLU, "relu": nn.ReLU}


def get_activation(name: str) -> Type[nn.Module]:
    """Map the ``activation`` option ("telu" | "relu") to a module class."""
    key = name.lower() if isinstance(name, str) else name
    if key not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}: choose one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[key]


def attention_sigmoid(x: Tensor) -> Tensor:
    """``torch.sigmoid(x)`` for attention weights; while tracing (the ONNX exporter) written as 1 / (1 + exp(-x)).

    ONNX Runtime's CPU Sigmoid is accurate to ~1e-7 absolute, not relative: saturated weights (sigmoid(-15) ~ 3e-7)
    lose most digits and later layers amplify the error (1.6 % of the logits' scale in one model). Exp and the division
    keep the relative precision."""
    if torch.jit.is_tracing():
        return torch.reciprocal(1 + torch.exp(-x))
    return torch.sigmoid(x)
