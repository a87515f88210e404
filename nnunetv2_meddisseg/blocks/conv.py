"""Conv + Norm + activation block (the paper's "CBT": Conv, BatchNorm, TeLU)."""
from typing import Optional, Type

from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.activation import TeLU

__all__ = ["same_padding", "ConvNormAct"]


def same_padding(kernel_size: int, dilation: int = 1) -> int:
    """Padding that keeps the spatial size for an odd kernel at stride 1."""
    if kernel_size % 2 != 1:
        raise ValueError(f"kernel_size must be odd for 'same' padding, got {kernel_size}")
    return dilation * (kernel_size - 1) // 2


class ConvNormAct(nn.Module):
    """conv_op -> norm_op -> nonlin with 'same' padding (stride 1 keeps H, W).

    Args:
        in_channels, out_channels: channel counts.
        kernel_size: odd kernel size (square).
        conv_op, norm_op: operator classes (2D in this project); ``norm_op=None`` skips the norm.
        nonlin: activation class, ``None`` for none (the CBT "act=False" variant).
        dilation, stride: as in ``conv_op``.
        conv_bias: bias of the convolution (off by default: the norm follows).

    Shapes: x: (B, in_channels, H, W) -> (B, out_channels, H / stride, W / stride).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        conv_op: Type[nn.Module] = nn.Conv2d,
        norm_op: Optional[Type[nn.Module]] = nn.BatchNorm2d,
        norm_op_kwargs: Optional[dict] = None,
        nonlin: Optional[Type[nn.Module]] = TeLU,
        nonlin_kwargs: Optional[dict] = None,
        dilation: int = 1,
        stride: int = 1,
        conv_bias: bool = False,
    ) -> None:
        super().__init__()
        self.conv = conv_op(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=same_padding(kernel_size, dilation),
            dilation=dilation,
            bias=conv_bias,
        )
        self.norm = norm_op(out_channels, **(norm_op_kwargs or {})) if norm_op is not None else nn.Identity()
        self.nonlin = nonlin(**(nonlin_kwargs or {})) if nonlin is not None else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.nonlin(self.norm(self.conv(x)))
