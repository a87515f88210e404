"""Activations used by Med-DisSeg: TeLU and a name -> class lookup for the ``activation`` option."""
from typing import Tuple, Type

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from nnunetv2_meddisseg.blocks.telu_kernels import telu_triton, telu_triton_available

__all__ = ["TELU_EXP_CLAMP", "telu", "TeLU", "get_activation", "attention_sigmoid"]

#: Upper clamp of the exponent input. tanh(exp(x)) == 1 exactly (even in float64) for x > ~3.7,
#: so clamping at 10 leaves the function unchanged while exp() stays finite in fp16 (exp(10) ~ 2.2e4
#: < 65504). Without it exp(x) overflows to inf for x > ~11 in fp16 and autograd multiplies
#: 0 (tanh') by inf -> NaN gradients.
TELU_EXP_CLAMP = 10.0
#: where TeLU's slope is exactly 1 in every float dtype (tanh(exp(4)) rounds to 1 even in float64)
_TELU_BACKWARD_CLAMP = 4.0


def _telu_forward(x: Tensor) -> Tensor:
    # No clamp needed for the value: where exp(x) overflows to inf, tanh(inf) = 1 = tanh(exp(10)), so
    # the result equals x * tanh(exp(min(x, 10))) bit for bit; the clamp only matters for the gradient.
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        # CPU kernels of exp and tanh are slower in bf16 than in fp32 (bf16 prediction at 256x256:
        # TeLU took 30 % of the forward); computed in fp32 and rounded once, it is faster and more exact
        return _telu_forward(x.float()).to(torch.bfloat16)
    y = torch.exp(x)
    y.tanh_()
    return y.mul_(x)


def _telu_and_slope(x: Tensor) -> Tuple[Tensor, Tensor]:
    """TeLU(x) and its derivative at x (same shape and dtype), in six operations.

    d/dx [x tanh(e^x)] = tanh(e^x) + x (1 - tanh^2(e^x)) e^x. Above x = 4, tanh(e^x) rounds to 1 in every float
    dtype (1 - tanh(e^4) ~ 4e-48), so x is clamped at 4 for the exponent: the value is unchanged, and the second
    term of the slope is exactly 0 there, as autograd's through the clamped exponent. (1 - t^2) multiplies the
    clamped x (|.| <= 4 above 0) before e^x (<= e^4), so that no intermediate overflows fp16."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        # as in _telu_forward: the CPU kernels of exp and tanh are faster (and more exact) in fp32
        y, slope = _telu_and_slope(x.float())
        return y.to(torch.bfloat16), slope.to(torch.bfloat16)
    xc = x.clamp(max=_TELU_BACKWARD_CLAMP)
    e = torch.exp(xc)
    t = torch.tanh(e)
    return t * x, torch.addcmul(t, torch.ops.aten.tanh_backward(xc, t), e)


class _TeLUFunction(torch.autograd.Function):
    """TeLU whose forward also computes the slope, the only tensor it saves (autograd would keep exp(x) and
    tanh(exp(x)) as well): the backward is one multiplication (seven operations in all, where the forward
    alone and a backward from the input take ten)."""

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
    """TeLU(x) = x * tanh(exp(x)), numerically safe in fp32 / fp16 / bf16.

    x: any shape; returns the same shape and dtype. On CUDA (outside torch.compile) one Triton kernel computes
    it (``telu_kernels``), elsewhere PyTorch's operations.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _TeLUFunction.apply(x)
    fast = telu_triton(x) if telu_triton_available(x) else None
    return fast[0] if fast is not None else _telu_forward(x)


class TeLU(nn.Module):
    """Module form of :func:`telu` (Fernandez & Mali, "TeLU activation function")."""

    def __init__(self, inplace: bool = False) -> None:
        # ``inplace`` is accepted (and ignored) so that TeLU can stand in wherever nn.ReLU(inplace=...) is built
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

    ONNX Runtime's CPU Sigmoid is accurate to about 1e-7 absolute, not relative: a saturated attention weight
    (sigmoid(-15) ~ 3e-7, seen in trained models) loses most of its digits, and the layers after the attention
    multiply the error up (1.6 % of the logits' scale in one smoke-trained Med-DisSeg). Exp and the division
    keep the relative precision. x: any shape -> same shape."""
    if torch.jit.is_tracing():
        return torch.reciprocal(1 + torch.exp(-x))
    return torch.sigmoid(x)
