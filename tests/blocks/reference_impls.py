"""First implementations of optimised blocks: the references the tests check the current ones against.

Same parameters, same results up to floating-point rounding. ``benchmarks/`` imports this module (by
path) to time before/after side by side.
"""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TELU_EXP_CLAMP
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation

__all__ = ["reference_window_weights", "reference_window_attention", "reference_linear", "reference_cdfa_forward",
           "reference_telu"]


def reference_window_weights(module: ContrastDrivenAggregation, guidance: Tensor, layer: nn.Linear) -> Tensor:
    """First implementation of ``ContrastDrivenAggregation.window_weights``.

    guidance: (B, dim, H, W) -> (B, heads, H*W, k*k (i), k*k (j))
    """
    b, _, h, w = guidance.shape
    window = module.kernel_size * module.kernel_size
    logits = layer(guidance.flatten(2).transpose(1, 2))  # (B, HW, heads * window * window)
    logits = logits.reshape(b, h * w, module.num_heads, window, window).transpose(1, 2)
    return torch.softmax(logits * module.scale, dim=-1)


def reference_window_attention(module: ContrastDrivenAggregation, values: Tensor, weights: Tensor) -> Tensor:
    """First implementation of ``window_attention`` (unfold -> per-pixel matmul -> fold).

    values: (B, dim, H, W), weights: (B, heads, H*W, k*k, k*k) -> (B, dim, H, W)
    """
    b, c, h, w = values.shape
    k, window = module.kernel_size, module.kernel_size * module.kernel_size
    # unfold channel index is c * window + j, c = head * head_dim + d
    v = F.unfold(values, k, padding=k // 2).reshape(b, module.num_heads, module.head_dim, window, h * w)
    v = v.permute(0, 1, 4, 3, 2)  # (B, heads, HW, j, head_dim)
    out = torch.matmul(weights, v)  # (B, heads, HW, i, head_dim)
    out = out.permute(0, 1, 4, 3, 2).reshape(b, c * window, h * w)
    out = F.fold(out, (h, w), k, padding=k // 2)  # sums the overlapping window contributions
    return reference_linear(module.proj, out)


def reference_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    return layer(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def reference_cdfa_forward(module: ContrastDrivenAggregation, x: Tensor, fg: Tensor, bg: Tensor) -> Tensor:
    """``ContrastDrivenAggregation.forward`` as first implemented (same parameters, same result up to
    floating-point rounding)."""
    x = module.input_convs(x)
    v = reference_linear(module.value, x)
    x = reference_window_attention(module, v, reference_window_weights(module, fg, module.attn_fg))
    x = reference_window_attention(module, x, reference_window_weights(module, bg, module.attn_bg))
    return module.output_convs(x)


def reference_telu(x: Tensor) -> Tensor:
    """First implementation of ``telu`` (plain autograd)."""
    return x * torch.tanh(torch.exp(x.clamp(max=TELU_EXP_CLAMP)))
