"""Normalisation layers of Med-DisSeg: torch's, with fewer kernel launches."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.conv import memory_format_of

__all__ = ["UncountedBatchNorm2d", "SingleKernelInstanceNorm2d", "instance_norm_channels_last"]


class UncountedBatchNorm2d(nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` that does not count its training batches when ``momentum`` is set.

    torch counts them in ``num_batches_tracked`` (a kernel launch per layer and step on a GPU) but reads the count
    only when ``momentum`` is None; otherwise all is torch's except ``num_batches_tracked``, which stays as loaded.
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.track_running_stats and self.momentum is not None and self.running_mean is not None:
            self._check_input_dim(x)
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, True,
                                self.momentum, self.eps)
        return super().forward(x)


def instance_norm_channels_last(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    """Instance norm keeping x's memory format and dtype: fp32 statistics per (image, channel), then one fused
    ``x * scale + shift`` in x's dtype. x: (B, C, H, W); weight, bias: (C,) or None.

    CUDA's group-norm kernel is NCHW only: a channels-last tensor costs a layout copy in, one back at the next
    convolution, and slow NCHW kernels in between.
    """
    var, mean = torch.var_mean(x.float(), dim=(2, 3), keepdim=True, correction=0)  # (B, C, 1, 1)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight.float().view(1, -1, 1, 1)
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias.float().view(1, -1, 1, 1)
    return torch.addcmul(shift.to(x.dtype), x, scale.to(x.dtype))


class SingleKernelInstanceNorm2d(nn.GroupNorm):
    """``torch.nn.InstanceNorm2d(num_features, eps, affine=affine)`` as a group norm with one channel per group.

    Same output, gradients and state-dict keys in one kernel, not torch's repeat + view + batch norm. Channels-last
    CUDA tensors go to ``instance_norm_channels_last`` (not under ``torch.compile``, which fuses the group norm). No
    running statistics (``track_running_stats`` must stay False): each image uses its own, in training and prediction.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = None,
                 affine: bool = True, track_running_stats: bool = False) -> None:
        if track_running_stats:
            raise ValueError(f"{type(self).__name__} keeps no running statistics: track_running_stats must be False")
        super().__init__(num_features, num_features, eps=eps, affine=affine)
        self.num_features = num_features

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4:
            raise ValueError(f"{type(self).__name__} expects (B, C, H, W) input, got shape {tuple(x.shape)}")
        if x.is_cuda and memory_format_of(x) == torch.channels_last and not torch.compiler.is_compiling():
            return instance_norm_channels_last(x, self.weight, self.bias, self.eps)
        return super().forward(x)

