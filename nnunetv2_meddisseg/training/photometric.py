"""Strong photometric perturbation of a normalised image batch (Stage I's second view), random per sample.

Inputs are z-scored, so each sample (RGB) or channel (otherwise) is mapped to [0, 1] by its min / max, perturbed
there and mapped back. RGB (``rgb=True``, 3 channels): brightness, contrast, saturation, hue rotation, random
grayscale, Gaussian blur. Anything else (CT, MRI, multi-modal): per channel brightness, contrast, gamma, Gaussian
blur; a channel's output depends on that channel alone.
"""
import math
from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["RGB_CHANNEL_NAMES", "channels_are_rgb", "photometric_perturbation"]

BRIGHTNESS = 0.3          # factor drawn from [1 - 0.3, 1 + 0.3]
CONTRAST = 0.3
SATURATION = 0.3
HUE = 0.1                 # rotation of the colour wheel by a fraction drawn from [-0.1, 0.1]
GRAYSCALE_P = 0.2
GAMMA_RANGE = (0.7, 1.5)  # non-RGB only
BLUR_SIGMA = (0.1, 2.0)
BLUR_RADIUS = 3           # kernel size 7

#: dataset.json channel names (lower case) that mark a 3-channel input as RGB (colour perturbations)
RGB_CHANNEL_NAMES = frozenset({"r", "g", "b", "red", "green", "blue", "rgb", "rgb_to_0_1"})

_LUMA = (0.299, 0.587, 0.114)
_NUM_DRAWS = 6            # random numbers per sample, the same for every path and channel count
_TINY = 1e-12


def _uniform(u: Tensor, low: float, high: float) -> Tensor:
    return low + (high - low) * u


def _gray(u: Tensor) -> Tensor:
    """u: (B, 3, H, W) -> luminance (B, 1, H, W)."""
    weights = u.new_tensor(_LUMA).view(1, 3, 1, 1)
    return (u * weights).sum(dim=1, keepdim=True)


def _hue_rotation(angle: Tensor) -> Tensor:
    """angle: (B,) radians -> (B, 3, 3) rotations of RGB space about the gray axis (1, 1, 1)."""
    k = 1.0 / math.sqrt(3.0)
    cross = angle.new_tensor([[0.0, -k, k], [k, 0.0, -k], [-k, k, 0.0]])  # [axis]_x
    outer = angle.new_full((3, 3), k * k)
    eye = torch.eye(3, dtype=angle.dtype, device=angle.device)
    cos = angle.cos().view(-1, 1, 1)
    sin = angle.sin().view(-1, 1, 1)
    return cos * eye + sin * cross + (1.0 - cos) * outer


def _gaussian_blur(u: Tensor, sigma: Tensor, radius: int = BLUR_RADIUS) -> Tensor:
    """Separable Gaussian blur of u (B, C, H, W) per channel, one sigma (B,) per sample; borders replicated."""
    b, c, h, w = u.shape
    offsets = torch.arange(-radius, radius + 1, dtype=u.dtype, device=u.device)
    kernel = torch.exp(-0.5 * (offsets[None, :] / sigma[:, None]) ** 2)
    kernel = (kernel / kernel.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # (B*C, 2r+1)
    size = 2 * radius + 1
    x = F.pad(u.reshape(1, b * c, h, w), (radius, radius, radius, radius), mode="replicate")
    x = F.conv2d(x, kernel.view(b * c, 1, size, 1), groups=b * c)
    x = F.conv2d(x, kernel.view(b * c, 1, 1, size), groups=b * c)
    return x.view(b, c, h, w)


def _perturb(u: Tensor, draws: Tensor, colour: bool) -> Tensor:
    """u: (B, C, H, W) in [0, 1]; draws: (B, _NUM_DRAWS) uniform in [0, 1). ``colour`` (C = 3): contrast about the
    luminance, saturation, hue, grayscale; else each channel on its own, contrast about its mean, gamma."""
    view = (-1, 1, 1, 1)
    brightness = _uniform(draws[:, 0], 1 - BRIGHTNESS, 1 + BRIGHTNESS).view(view)
    u = (u * brightness).clamp(0.0, 1.0)
    contrast = _uniform(draws[:, 1], 1 - CONTRAST, 1 + CONTRAST).view(view)
    mean = (_gray(u) if colour else u).mean(dim=(2, 3), keepdim=True)
    u = ((u - mean) * contrast + mean).clamp(0.0, 1.0)
    if colour:
        saturation = _uniform(draws[:, 2], 1 - SATURATION, 1 + SATURATION).view(view)
        gray = _gray(u)
        u = ((u - gray) * saturation + gray).clamp(0.0, 1.0)
        rotation = _hue_rotation(2.0 * math.pi * _uniform(draws[:, 3], -HUE, HUE))
        u = torch.einsum("bij,bjhw->bihw", rotation, u).clamp(0.0, 1.0)
        to_gray = (draws[:, 4] < GRAYSCALE_P).view(view)
        u = torch.where(to_gray, _gray(u).expand_as(u), u)
    else:
        gamma = _uniform(draws[:, 2], *GAMMA_RANGE).view(view)
        u = u.pow(gamma)
    return _gaussian_blur(u, _uniform(draws[:, 5], *BLUR_SIGMA))


def channels_are_rgb(dataset_json: Mapping[str, object], num_channels: int) -> bool:
    """Whether the input is 3 channels named in ``RGB_CHANNEL_NAMES`` (dataset.json ``channel_names``/``modality``)."""
    if num_channels != 3:
        return False
    names = dataset_json.get("channel_names", dataset_json.get("modality", {}))
    lowered = [str(v).lower() for v in names.values()]
    return len(lowered) == 3 and all(n in RGB_CHANNEL_NAMES for n in lowered)


@torch.no_grad()
def photometric_perturbation(x: Tensor, rgb: bool, generator: Optional[torch.Generator] = None) -> Tensor:
    """A strongly perturbed copy of a normalised batch, parameters drawn per sample; no gradient flows through it.
    x: (B, C, H, W) float, any range. Colour operations only where ``rgb`` and C == 3. ``generator`` (any device) makes
    the draws reproducible; they depend neither on C nor on the data. The result has x's shape, dtype and device, within
    each sample's (RGB) or channel's original [min, max]."""
    if x.ndim != 4:
        raise ValueError(f"photometric_perturbation: x must be (B, C, H, W), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"photometric_perturbation: x must be a float tensor, got dtype {x.dtype}")
    b, c = x.shape[:2]
    if b == 0:
        return x.clone()
    draw_device = generator.device if generator is not None else torch.device("cpu")
    draws = torch.rand(b, _NUM_DRAWS, generator=generator, device=draw_device).to(x.device)
    colour = rgb and c == 3
    reduce_dims = (1, 2, 3) if colour else (2, 3)
    with torch.autocast(device_type=x.device.type, enabled=False):
        xf = x.float()
        low = xf.amin(dim=reduce_dims, keepdim=True)
        span = xf.amax(dim=reduce_dims, keepdim=True) - low
        u = (xf - low) / span.clamp_min(_TINY)
        u = _perturb(u, draws, colour)
        out = u.clamp(0.0, 1.0) * span + low
    return out.to(x.dtype)
