"""Activations used by Med-DisSeg: TeLU and a name -> class lookup for the ``activation`` option."""
from typing import Type

import torch
from torch import Tensor, nn

__all__ = ["TELU_EXP_CLAMP", "telu", "TeLU", "get_activation"]

#: Upper clamp of the exponent input. tanh(exp(x)) == 1 exactly (even in float64) for x > ~3.7,
#: so clamping at 10 leaves the function unchanged while exp() stays finite in fp16 (exp(10) ~ 2.2e4
#: < 65504). Without it exp(x) overflows to inf for x > ~11 in fp16 and autograd multiplies
#: 0 (tanh') by inf -> NaN gradients.
TELU_EXP_CLAMP = 10.0


def telu(x: Tensor) -> Tensor:
    """TeLU(x) = x * tanh(exp(x)), numerically safe in fp32 / fp16 / bf16.

    x: any shape; returns the same shape and dtype.
    """
    return x * torch.tanh(torch.exp(x.clamp(max=TELU_EXP_CLAMP)))


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
