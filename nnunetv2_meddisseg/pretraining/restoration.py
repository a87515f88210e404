"""Models Genesis restoration in 2D (Zhou et al., MedIA 2021): corrupted views of an image (``corrupt``) and a light
head that restores them from a ResNet-50 encoder's features (``EncoderRestorationNet``).

Per image, in this order: local pixel shuffling (probability 0.5), a non-linear intensity transform (0.9), then
painting (0.9): out-painting (80 %) or in-painting (20 %). Every draw comes from the ``generator`` passed in.
"""
from __future__ import annotations

from typing import Iterator, List, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["LOCAL_SHUFFLE_RATE", "NONLINEAR_RATE", "PAINT_RATE", "INPAINT_RATE", "local_pixel_shuffling",
           "nonlinear_transform", "in_painting", "out_painting", "corrupt", "RestorationHead",
           "EncoderRestorationNet"]

LOCAL_SHUFFLE_RATE = 0.5
NONLINEAR_RATE = 0.9
PAINT_RATE = 0.9
INPAINT_RATE = 0.2


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator))


def _randint(generator: torch.Generator, low: int, high: int) -> int:
    """An integer in [low, high] (both included)."""
    return int(torch.randint(low, high + 1, (), generator=generator))


def local_pixel_shuffling(image: Tensor, generator: torch.Generator) -> Tensor:
    """image (C, H, W) in [0, 1] -> the same with the pixels of about half the tiles of one random size (2 to a tenth
    of the shorter side) permuted within their tile; all channels of a pixel move together."""
    c, h, w = image.shape
    size = _randint(generator, 2, max(2, min(h, w) // 10))
    nh, nw = h // size, w // size
    if nh == 0 or nw == 0:
        return image
    oy, ox = _randint(generator, 0, h - nh * size), _randint(generator, 0, w - nw * size)
    region = image[:, oy:oy + nh * size, ox:ox + nw * size]
    tiles = region.reshape(c, nh, size, nw, size).permute(0, 1, 3, 2, 4).reshape(c, nh, nw, size * size)
    order = torch.argsort(torch.rand((nh, nw, size * size), generator=generator), dim=-1)
    chosen = torch.rand((nh, nw, 1), generator=generator) < 0.5
    order = torch.where(chosen, order, torch.arange(size * size).expand(nh, nw, -1))
    shuffled = torch.gather(tiles, -1, order.unsqueeze(0).expand(c, -1, -1, -1))
    out = image.clone()
    out[:, oy:oy + nh * size, ox:ox + nw * size] = (
        shuffled.reshape(c, nh, nw, size, size).permute(0, 1, 3, 2, 4).reshape(c, nh * size, nw * size))
    return out


def _bezier(points: Tensor, steps: int = 1000) -> Tuple[Tensor, Tensor]:
    """The cubic Bezier curve through control points (4, 2): (xs, ys) at ``steps`` parameter values."""
    t = torch.linspace(0, 1, steps, dtype=points.dtype).unsqueeze(1)
    curve = ((1 - t) ** 3 * points[0] + 3 * (1 - t) ** 2 * t * points[1] + 3 * (1 - t) * t ** 2 * points[2]
             + t ** 3 * points[3])
    return curve[:, 0], curve[:, 1]


def _interp(x: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
    """Piecewise-linear interpolation of (xs, ys), xs increasing, at x (``numpy.interp``)."""
    index = torch.searchsorted(xs, x.clamp(xs[0], xs[-1]).reshape(-1)).clamp(1, len(xs) - 1)
    x0, x1, y0, y1 = xs[index - 1], xs[index], ys[index - 1], ys[index]
    weight = ((x.reshape(-1) - x0) / (x1 - x0).clamp_min(1e-12)).clamp(0, 1)
    return (y0 + weight * (y1 - y0)).reshape(x.shape)


def nonlinear_transform(image: Tensor, generator: torch.Generator) -> Tensor:
    """image in [0, 1] -> a random monotone Bezier curve of it, mirrored (decreasing) for half of the draws."""
    points = torch.tensor([[0.0, 0.0], [_uniform(generator), _uniform(generator)],
                           [_uniform(generator), _uniform(generator)], [1.0, 1.0]], dtype=image.dtype)
    xs, ys = _bezier(points)
    xs, ys = torch.sort(xs).values, torch.sort(ys).values
    if _uniform(generator) < 0.5:
        ys = torch.flip(ys, (0,))
    return _interp(image, xs, ys)


def _boxes(generator: torch.Generator, h: int, w: int, most: int, low: float, high: float) -> Iterator[tuple]:
    """Up to ``most`` boxes, each after the first with probability 0.95; lazy, as callers draw between boxes."""
    for count in range(most):
        if count > 0 and _uniform(generator) >= 0.95:
            return
        bh = _randint(generator, max(1, int(low * h)), max(1, int(high * h)))
        bw = _randint(generator, max(1, int(low * w)), max(1, int(high * w)))
        y, x = _randint(generator, 0, h - bh), _randint(generator, 0, w - bw)
        yield slice(y, y + bh), slice(x, x + bw)


def in_painting(image: Tensor, generator: torch.Generator) -> Tensor:
    """image (C, H, W) in [0, 1] -> up to five boxes (a sixth to a third of each side) replaced by uniform noise."""
    out = image.clone()
    for ys, xs in _boxes(generator, *image.shape[1:], 5, 1 / 6, 1 / 3):
        out[:, ys, xs] = torch.rand(out[:, ys, xs].shape, generator=generator, dtype=image.dtype)
    return out


def out_painting(image: Tensor, generator: torch.Generator) -> Tensor:
    """image (C, H, W) in [0, 1] -> uniform noise outside up to four kept boxes (3/7 to 4/7 of each side)."""
    out = torch.rand(image.shape, generator=generator, dtype=image.dtype)
    for ys, xs in _boxes(generator, *image.shape[1:], 4, 1 - 4 / 7, 1 - 3 / 7):
        out[:, ys, xs] = image[:, ys, xs]
    return out


def corrupt(batch: Tensor, generator: torch.Generator) -> Tensor:
    """batch (B, C, H, W), any range -> its corruption in the same range: each image is scaled to [0, 1] by its own
    minimum and maximum, corrupted, and scaled back. Computed on the CPU from ``generator`` (a CPU generator)."""
    out = torch.empty_like(batch, device="cpu")
    for i, image in enumerate(batch.detach().float().cpu()):
        low, high = image.min(), image.max()
        scale = (high - low).clamp_min(1e-6)
        x = (image - low) / scale
        if _uniform(generator) < LOCAL_SHUFFLE_RATE:
            x = local_pixel_shuffling(x, generator)
        if _uniform(generator) < NONLINEAR_RATE:
            x = nonlinear_transform(x, generator)
        if _uniform(generator) < PAINT_RATE:
            x = in_painting(x, generator) if _uniform(generator) < INPAINT_RATE else out_painting(x, generator)
        out[i] = x * scale + low
    return out.to(batch.device)


class RestorationHead(nn.Module):
    """A light feature-pyramid decoder: the features ``[x1 (H/2), x2 (H/4), x3 (H/8), x4 (H/16)]``, each projected to
    ``width`` channels, are merged from the coarsest up, up-sampled to (H, W) and mapped to ``out_channels``."""

    def __init__(self, in_channels: Sequence[int], out_channels: int, width: int = 64) -> None:
        super().__init__()
        self.lateral = nn.ModuleList([nn.Conv2d(c, width, 1) for c in in_channels])
        self.merge = nn.ModuleList([nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False),
                                                  nn.InstanceNorm2d(width, affine=True),
                                                  nn.LeakyReLU(0.01, inplace=True))
                                    for _ in in_channels[:-1]])
        self.out = nn.Conv2d(width, out_channels, 3, padding=1)

    def forward(self, features: List[Tensor], size: Tuple[int, int]) -> Tensor:
        y = self.lateral[-1](features[-1])
        for level in range(len(features) - 2, -1, -1):
            y = F.interpolate(y, size=features[level].shape[2:], mode="bilinear", align_corners=False)
            y = self.merge[level](y + self.lateral[level](features[level]))
        return self.out(F.interpolate(y, size=size, mode="bilinear", align_corners=False))


class EncoderRestorationNet(nn.Module):
    """A ``ResNet50Encoder`` and a ``RestorationHead``: x (B, C, H, W), H and W multiples of 16 -> restored x."""

    def __init__(self, encoder: nn.Module, channels: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = RestorationHead(encoder.output_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x), x.shape[2:])
