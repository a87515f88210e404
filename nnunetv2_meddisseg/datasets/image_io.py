"""Reading source images and masks (PIL), and writing a binary 2D case as nnU-Net PNGs."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from PIL import Image

from .cases import SourceCase
from .errors import ConversionError, MissingSourceError

__all__ = ["LOSSY_SUFFIXES", "image_size", "read_rgb", "read_binary_mask", "read_instance_mask_as_binary",
           "check_2d_sizes", "write_binary_2d_case", "short_error"]

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


def read_rgb(path: Path) -> Image.Image:
    """The image as a decoded 8-bit RGB ``PIL.Image`` (grey, palette and RGBA converted)."""
    img = _load(_open(path), path)
    return img if img.mode == "RGB" else img.convert("RGB")


def _grey_array(img: Image.Image) -> Tuple[np.ndarray, int]:
    """Single-channel array of a mask and its full range: 255, or 65535 for 16-bit and integer
    masks whose values go above 255 (8-bit values stored in a 16-bit file keep 255)."""
    if img.mode.startswith("I") or img.mode == "F":
        arr = np.asarray(img).astype(np.float64)
        return arr, 65535 if arr.max(initial=0) > 255 else 255
    if img.mode == "1":
        return np.asarray(img).astype(np.uint8) * 255, 255
    if img.mode != "L":
        img = img.convert("L")
    return np.asarray(img), 255


def read_binary_mask(path: Path, lossy: Optional[bool] = None) -> np.ndarray:
    """A binary mask as ``(H, W)`` uint8 in {0, 1}.

    Colour masks are converted to grey first. JPEG masks (``lossy``, by default decided by the
    file suffix) are thresholded at half their range (> 127 for 8 bit): their edges and
    background are noisy. Lossless masks already holding only {0, 1} (also as palette indices)
    are kept as labels; any other lossless mask is thresholded at half its range too (0/255
    masks, anti-aliased edges).
    """
    path = Path(path)
    if lossy is None:
        lossy = path.suffix.lower() in LOSSY_SUFFIXES
    img = _load(_open(path), path)
    if img.mode == "P":  # palette masks: the indices are the labels when they are 0/1
        indices = np.asarray(img)
        if indices.max(initial=0) <= 1:
            return indices.astype(np.uint8)
    arr, full = _grey_array(img)
    if not lossy and arr.max(initial=0) <= 1 and arr.min(initial=0) >= 0:
        return arr.astype(np.uint8)
    return (arr > full / 2).astype(np.uint8)


def read_instance_mask_as_binary(path: Path) -> np.ndarray:
    """An instance-label mask (0 background, 1..K objects) as binary ``(H, W)`` uint8."""
    img = _load(_open(path), path)
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
    image.save(image_file, format="PNG")
    mask_img.save(label_file, format="PNG")
