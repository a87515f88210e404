"""Reading source images and masks (PIL), and writing a binary 2D case as nnU-Net PNGs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from .cases import SourceCase
from .errors import ConversionError, MissingSourceError

__all__ = ["LOSSY_SUFFIXES", "image_size", "read_rgb", "read_binary_mask", "read_instance_mask_as_binary",
           "check_2d_sizes", "write_binary_2d_case", "short_error", "WIDE_MODES"]

LOSSY_SUFFIXES = (".jpg", ".jpeg")


def _open(path: Path) -> Image.Image:
    try:
        img = Image.open(path)
    except FileNotFoundError:
        raise MissingSourceError(f"{path} does not exist") from None
    except Exception as err:  # PIL raises many kinds for unreadable files
        raise ConversionError(f"cannot read image {path}: {short_error(err)}") from None
    return img


def _load(img: Image.Image, path: Path) -> Image.Image:
    try:
        img.load()
    except Exception as err:
        raise ConversionError(f"cannot read image {path} (corrupt or truncated?): {short_error(err)}") from None
    return img


def short_error(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def image_size(path: Path) -> Tuple[int, int]:
    """``(width, height)`` from the file header (cheap: no decoding)."""
    with _open(path) as img:
        return img.size


#: PIL modes of images with more than 8 bits per value (16-bit and 32-bit integers, 32-bit float)
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
#: a value strictly between 0 and a lossless mask's maximum that covers more than this fraction of the
#: pixels is a label of its own, not an anti-aliased edge
AMBIGUOUS_FRACTION = 0.01


def read_rgb(path: Path) -> Image.Image:
    """The image as a decoded 8-bit RGB ``PIL.Image``.

    8-bit images (grey, palette, RGB; RGBA without its alpha) keep their values. Images with more
    bits (16-bit, 32-bit integer, float) are scaled linearly from their real range [min, max] to
    [0, 255] (integer images whose values all lie in 0..255 keep them), so that no contrast is clipped;
    one holding NaN or inf is refused with a line saying how to convert it."""
    img = _load(_open(path), path)
    if img.mode in WIDE_MODES:
        arr = np.asarray(img, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ConversionError(f"image {path} holds NaN or inf values: replace them (e.g. numpy.nan_to_num) and "
                                  f"save it as an 8-bit or 16-bit PNG")
        low, high = float(arr.min(initial=0)), float(arr.max(initial=0))
        if img.mode == "F" or low < 0 or high > 255:
            arr = (arr - low) / (high - low) * 255 if high > low else np.zeros_like(arr)
        img = Image.fromarray(np.rint(arr).astype(np.uint8), mode="L")
    return img if img.mode == "RGB" else img.convert("RGB")


def _mask_values(img: Image.Image, path: Path) -> Tuple[np.ndarray, int]:
    """One value per pixel of a mask and its full range (see :func:`read_binary_mask` for the rule)."""
    if img.mode in WIDE_MODES:
        arr = np.asarray(img).astype(np.float64)
        if not np.isfinite(arr).all():
            raise ConversionError(f"mask {path} holds NaN or inf values: expected a binary mask (0 background, "
                                  f"one foreground value)")
        return arr, 65535 if arr.max(initial=0) > 255 else 255
    if img.mode == "1":
        return np.asarray(img).astype(np.uint8) * 255, 255
    if img.mode == "L":
        return np.asarray(img), 255
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode not in ("LA", "RGB", "RGBA"):
        img = img.convert("RGB")
    arr = np.asarray(img)
    colour = arr[..., :-1] if img.mode in ("LA", "RGBA") else arr
    colour = colour.max(axis=-1)
    if img.mode in ("LA", "RGBA"):
        alpha = arr[..., -1]
        if colour.min(initial=0) == colour.max(initial=0) and alpha.min(initial=0) != alpha.max(initial=0):
            return alpha, 255  # one colour everywhere: the foreground is drawn in alpha
    return colour, 255


def read_binary_mask(path: Path, lossy: Optional[bool] = None) -> np.ndarray:
    """A binary mask as ``(H, W)`` uint8 in {0, 1}, by one rule for every kind of mask file.

    - One value per pixel: grey and 16-bit masks their value; RGB (and palette colours) the brightest
      of its channels, so pure red, green or blue count; RGBA / LA the same, except that where the
      colour is one value everywhere and alpha varies, alpha is the mask. Palette masks whose indices
      are only 0 and 1 are labels as they are.
    - Lossless masks holding only {0, 1}, or 0 and one other value, are that label. Any other lossless
      mask (anti-aliased edges) and every JPEG mask (``lossy``, by default decided by the file suffix:
      noisy edges and background) are foreground above half their range (> 127 for 8 bit, > 32767 for
      16-bit values above 255).
    - Refused, naming the file: a lossless mask in which a value between 0 and its maximum covers more
      than 1 % of the pixels (``{0, 128, 255}``: a second class, or 'uncertain'?), and a mask with
      bright pixels that would come out empty.
    """
    path = Path(path)
    if lossy is None:
        lossy = path.suffix.lower() in LOSSY_SUFFIXES
    img = _load(_open(path), path)
    if img.mode == "P":
        indices = np.asarray(img)
        if indices.max(initial=0) <= 1:
            return indices.astype(np.uint8)
    arr, full = _mask_values(img, path)
    values, counts = np.unique(arr, return_counts=True)
    if not lossy and values.min(initial=0) >= 0 and (values.max(initial=0) <= 1 or (len(values) == 2 and values[0] == 0)):
        return (arr > 0).astype(np.uint8)
    if not lossy:
        between = [(v, c) for v, c in zip(values, counts) if 0 < v < values[-1] and c > AMBIGUOUS_FRACTION * arr.size]
        if between:
            shown = ", ".join(f"{v:g}" for v in values) if len(values) <= 8 else f"{len(values)} values"
            raise ConversionError(
                f"mask {path} holds the values {{{shown}}}: {between[0][0]:g} covers {100 * between[0][1] / arr.size:.0f} % "
                f"of the pixels, so it is no anti-aliased edge (expected a binary mask: 0 and one foreground value)")
    binary = (arr > full / 2).astype(np.uint8)
    if not binary.any() and arr.max(initial=0) > (full / 4 if lossy else 0):
        raise ConversionError(f"mask {path} would be written empty: its values reach {arr.max():g} but none exceeds "
                              f"half its range ({full / 2:g}); expected a binary mask with foreground above that")
    return binary


def read_instance_mask_as_binary(path: Path) -> np.ndarray:
    """An instance-label mask (0 background, 1..K objects; colour masks: any channel, alpha ignored) as
    binary ``(H, W)`` uint8."""
    img = _load(_open(path), path)
    if img.mode in ("LA", "RGBA", "PA"):
        img = img.convert("RGB")
    arr = np.asarray(img)
    if arr.ndim == 3:
        arr = arr.max(axis=-1)
    return (arr > 0).astype(np.uint8)


def check_2d_sizes(case: SourceCase) -> None:
    """Image and mask headers are readable and give the same width and height."""
    image, mask = image_size(case.image), image_size(case.label)
    if image != mask:
        raise ConversionError(f"mask {case.label} is {mask[0]}x{mask[1]} but image {case.image} is "
                              f"{image[0]}x{image[1]} (expected the same size)")


def write_binary_2d_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int],
                         instance_mask: bool = False) -> None:
    """Write an RGB PNG image and a {0, 1} label PNG, optionally resized to ``resize x resize``
    (image bilinear, mask nearest neighbour after binarisation)."""
    image = read_rgb(case.image)
    mask = read_instance_mask_as_binary(case.label) if instance_mask else read_binary_mask(case.label)
    if image.size != (mask.shape[1], mask.shape[0]):
        raise ConversionError(f"mask {case.label} is {mask.shape[1]}x{mask.shape[0]} but image {case.image} "
                              f"is {image.size[0]}x{image.size[1]} (expected the same size)")
    mask_img = Image.fromarray(mask, mode="L")
    if resize is not None:
        image = image.resize((resize, resize), Image.Resampling.BILINEAR)
        mask_img = mask_img.resize((resize, resize), Image.Resampling.NEAREST)
        if mask.any() and not np.asarray(mask_img).any():
            raise ConversionError(f"--resize {resize}: the foreground of mask {case.label} ({int(mask.sum())} pixels) "
                                  f"vanishes at {resize}x{resize}: choose a larger --resize")
    image.save(image_file, format="PNG")
    mask_img.save(label_file, format="PNG")
