"""Reading source images and masks (masks by one rule, ``read_binary_mask``); writing binary 2D cases as PNGs."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from .cases import MaskFinding, SourceCase
from .errors import ConversionError, MissingSourceError, OptionError

__all__ = ["LOSSY_SUFFIXES", "read_rgb", "read_binary_mask", "inspect_mask",
           "read_instance_mask_as_binary", "check_2d_sizes", "inspect_case_mask", "write_binary_2d_case",
           "short_error", "WIDE_MODES"]

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


#: PIL modes with more than 8 bits per value (16-bit and 32-bit integers, 32-bit float)
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def read_rgb(path: Path) -> Image.Image:
    """The image as decoded 8-bit RGB ``PIL.Image``; wider images are scaled linearly from [min, max] to [0, 255]
    (unless integers all in 0..255), so no contrast is clipped; NaN or inf is refused."""
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


def _mask_values(img: Image.Image, path: Path) -> Tuple[np.ndarray, int, Optional[np.ndarray]]:
    """One value per pixel of a mask, its full range and, for colour masks, the ``(H, W, C)`` colours behind them."""
    if img.mode in WIDE_MODES:
        arr = np.asarray(img).astype(np.float64)
        if not np.isfinite(arr).all():
            raise ConversionError(f"mask {path} holds NaN or inf values: expected a binary mask (0 background, "
                                  f"one foreground value)")
        return arr, 65535 if arr.max(initial=0) > 255 else 255, None
    if img.mode == "1":
        return np.asarray(img).astype(np.uint8) * 255, 255, None
    if img.mode == "L":
        return np.asarray(img), 255, None
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode not in ("LA", "RGB", "RGBA"):
        img = img.convert("RGB")
    arr = np.asarray(img)
    colours = arr[..., :-1] if img.mode in ("LA", "RGBA") else arr
    colour = np.maximum.reduce([colours[..., i] for i in range(colours.shape[-1])])  # (faster than max(axis=-1))
    if img.mode in ("LA", "RGBA"):
        alpha = arr[..., -1]
        if colour.min(initial=0) == colour.max(initial=0) and alpha.min(initial=0) != alpha.max(initial=0):
            return alpha, 255, None  # one colour everywhere: the foreground is drawn in alpha
    return colour, 255, colours if colours.shape[-1] == 3 else None


#: the bands, fractions of a lossless mask's range: background at or below the first, foreground at or above the second
BACKGROUND_BAND = 0.25
FOREGROUND_BAND = 0.75
#: over this share of pixels a lossless mask's middle value is a class ('uncertain'), not an edge; faint values reported
AMBIGUOUS_FRACTION = 0.01
#: JPEG masks: the noise tolerance around each histogram level and black, as a fraction of the range
LOSSY_NOISE = 0.05
#: JPEG masks: JPEG keeps a flat region within this many steps of its value
_LOSSY_CORE = 2
#: the classes of a binary dataset's masks: background and one foreground
BINARY_CLASSES = 2
#: colours whose channels, scaled by the brightest, agree within this step are one hue, one class
_HUE_STEP = 4


def _percent(fraction: float) -> str:
    """``0.3`` -> ``"30"``, ``0.012`` -> ``"1.2"``."""
    return f"{100 * fraction:.1f}".rstrip("0").rstrip(".")


def _value_counts(arr: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of ``arr`` and their counts (``np.unique``; by counting for 8-bit masks)."""
    if arr.dtype == np.uint8:
        counts = np.bincount(arr.reshape(-1), minlength=256)
        values = np.flatnonzero(counts)
        return values.astype(np.uint8), counts[values]
    return np.unique(arr, return_counts=True)


def _shown_values(values: np.ndarray) -> str:
    return ", ".join(f"{v:g}" for v in values) if len(values) <= 8 else f"{len(values)} values"


def _colour_classes(colours: np.ndarray, values: np.ndarray, low: float) -> List[Tuple[Tuple[int, ...], float]]:
    """``[(most frequent colour, share)]`` of the hues above ``low`` each over ``AMBIGUOUS_FRACTION``, largest first."""
    bright = colours[values > low].astype(np.int64)  # (N, 3)
    if not len(bright):
        return []
    packed, counts = np.unique((bright[:, 0] << 16) | (bright[:, 1] << 8) | bright[:, 2], return_counts=True)
    found = np.stack([packed >> 16, (packed >> 8) & 255, packed & 255], axis=1)
    hues = np.rint(found * _HUE_STEP / found.max(axis=1, keepdims=True)).astype(int)
    groups: Dict[Tuple[int, ...], List[int]] = {}
    for i, hue in enumerate(map(tuple, hues)):
        groups.setdefault(hue, []).append(i)
    classes = []
    for members in groups.values():
        share = counts[members].sum() / values.size
        if share > AMBIGUOUS_FRACTION:
            top = max(members, key=lambda i: counts[i])
            classes.append((tuple(int(c) for c in found[top]), float(share)))
    return sorted(classes, key=lambda cs: -cs[1])


def _several_classes(path: Path, values: np.ndarray, counts: np.ndarray, arr: np.ndarray, colours: Optional[np.ndarray],
                     low: float) -> Optional[str]:
    """Why a lossless mask is a label map, or None: two or more non-zero low-band values (``{0, 1, 2}``, all read as
    background) or two or more non-background hues, each over 1 % of the mask."""
    area = AMBIGUOUS_FRACTION * arr.size
    if values.max(initial=0) <= low:
        labels = [v for v, c in zip(values, counts) if v > 0 and c > area]
        if len(labels) >= BINARY_CLASSES:
            return (f"mask {path} holds the values {{{_shown_values(values)}}}: {_shown_values(labels)} each cover "
                    f"more than {_percent(AMBIGUOUS_FRACTION)} % of the pixels and all lie at or below 25 % of its "
                    f"range ({low:.10g}): a label map of {len(labels) + 1} classes (a binary dataset has "
                    f"{BINARY_CLASSES}: background and one foreground), or faint values without a foreground; "
                    f"expected a binary mask (0 and one foreground value)")
    if colours is not None:
        hues = _colour_classes(colours, arr, low)
        if len(hues) >= BINARY_CLASSES:
            shown = ", ".join(f"{colour} {_percent(share)} %" for colour, share in hues)
            return (f"mask {path} holds {len(hues)} colours of different hues that each cover more than "
                    f"{_percent(AMBIGUOUS_FRACTION)} % of the pixels ({shown}): a label map of {len(hues) + 1} "
                    f"classes, but a binary dataset has {BINARY_CLASSES} (background and one foreground); expected a "
                    f"binary mask (0 and one foreground colour)")
    return None


def _lossy_levels(values: np.ndarray, counts: np.ndarray, full: int) -> List[Tuple[float, float]]:
    """A lossy mask's histogram levels, ``[(level, share of the pixels in its band)]`` by level: each the most frequent
    value within the noise tolerance t (``LOSSY_NOISE`` of the range: 12.75 of 255) whose core (values within
    ``_LOSSY_CORE`` steps: JPEG spreads a flat 128 over 127 and 129) holds over ``AMBIGUOUS_FRACTION`` of the pixels;
    its band: the values within t. Levels closer than 2 t are one: JPEG can move a small region's values by over t."""
    tol = LOSSY_NOISE * full
    values = values.astype(np.float64)
    cumulative = np.concatenate([[0], np.cumsum(counts)])

    def share(radius: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        start = np.searchsorted(values, values - radius, side="left")
        end = np.searchsorted(values, values + radius, side="right")
        return (cumulative[end] - cumulative[start]) / cumulative[-1], start, end

    core, _, _ = share(_LOSSY_CORE)
    band, start, end = share(tol)
    levels: List[Tuple[float, float]] = []
    for i in np.argsort(-counts, kind="stable"):
        if core[i] <= AMBIGUOUS_FRACTION or counts[i] < counts[start[i]:end[i]].max():
            continue
        if all(abs(values[i] - level) > 2 * tol for level, _ in levels):
            levels.append((float(values[i]), float(band[i])))
    return sorted(levels)


def _lossy_01_label(values: np.ndarray, counts: np.ndarray) -> bool:
    """Whether a lossy mask near black is a 0/1 label: JPEG keeps a one-step contrast at 0 and 1 (edges one step
    off), while a brighter drawing's noise spreads further from black."""
    n = counts.sum()
    top = values[np.argsort(-counts, kind="stable")[:2]]
    return (sorted(top.tolist()) == [0, 1] and counts[values <= 1].min() > AMBIGUOUS_FRACTION * n
            and counts[values > 2].sum() <= AMBIGUOUS_FRACTION * n)


def _grey(colours: Optional[np.ndarray], tol: float) -> bool:
    """Whether a mask is grey, allowing JPEG colour noise. JPEG halves colour resolution, smearing a coloured mask's
    edges over every value of its brightest channel, so such a mask's levels are not read."""
    if colours is None:
        return True
    spread = colours.max(axis=-1).astype(np.int16) - colours.min(axis=-1)
    return np.count_nonzero(spread > tol) <= AMBIGUOUS_FRACTION * spread.size


def _lossy_ambiguous(path: Path, levels: List[Tuple[float, float]], full: int) -> Optional[MaskFinding]:
    """The ambiguous finding of a lossy mask, or None: a middle-band level beside another beyond black's noise
    (``{0, 128, 255}``, ``{0, 100, 200}``). Low-band levels alone are not read as a label map: the half-range cut
    empties such a mask, which refuses it, and a faint drawing's edges may pass for a level."""
    tol, low, high = LOSSY_NOISE * full, BACKGROUND_BAND * full, FOREGROUND_BAND * full
    beyond = [level for level, _ in levels if level > tol]
    middle = [(level, share) for level, share in levels if low < level < high]
    if not middle or len(beyond) < BINARY_CLASSES:
        return None
    level, share = max(middle, key=lambda ls: ls[1])
    shown = ", ".join(f"{v:g} ({_percent(s)} %)" for v, s in levels)
    return MaskFinding(path, "ambiguous", (
        f"mask {path} holds the levels {{{shown}}} (a lossy mask: each level with the values within "
        f"{tol:g} of it, its noise): {level:g} covers {_percent(share)} % of the pixels, in the middle of its range "
        f"(above {low:.10g}, below {high:.10g}), so it is neither faint background nor an anti-aliased edge "
        f"(expected a binary mask: 0 and one foreground value)"))


def _apply_rule(path: Path, lossy: Optional[bool], threshold: Optional[float]) -> Tuple[Optional[np.ndarray],
                                                                                          MaskFinding]:
    """``read_binary_mask``'s rule: the ``(H, W)`` uint8 {0, 1} mask (None where refused) and the finding."""
    path = Path(path)
    if lossy is None:
        lossy = path.suffix.lower() in LOSSY_SUFFIXES
    img = _load(_open(path), path)
    file_range = 65535 if img.mode in WIDE_MODES else 255
    if threshold is not None and threshold >= file_range:  # every mask, labels included: T is a value of each
        raise OptionError(f"--mask_threshold {threshold:g} is not below the range of mask {path} (0..{file_range}): "
                          f"expected a value between 0 and {file_range}")
    if img.mode == "P":
        indices = np.asarray(img)
        if indices.max(initial=0) <= 1:
            return indices.astype(np.uint8), MaskFinding(path, "label")
    arr, full, colours = _mask_values(img, path)
    values, counts = _value_counts(arr)
    two_valued = len(values) == 2 and values[0] == 0
    if not lossy and values.min(initial=0) >= 0 and (values.max(initial=0) <= 1 or two_valued) and \
            (colours is None or len(_colour_classes(colours, arr, 0)) < BINARY_CLASSES):
        return (arr > 0).astype(np.uint8), MaskFinding(path, "label")
    low, high = BACKGROUND_BAND * full, FOREGROUND_BAND * full
    if lossy:
        if values.max(initial=0) <= LOSSY_NOISE * full:
            if values.min(initial=0) >= 0 and _lossy_01_label(values, counts):
                return (arr >= 1).astype(np.uint8), MaskFinding(path, "lossy_label")
        elif threshold is None and _grey(colours, LOSSY_NOISE * full):
            ambiguous = _lossy_ambiguous(path, _lossy_levels(values, counts, full), full)
            if ambiguous:
                return None, ambiguous
        kind = "lossy"
    else:
        several = _several_classes(path, values, counts, arr, colours, low)
        if several:
            return None, MaskFinding(path, "classes", several)
        area = AMBIGUOUS_FRACTION * arr.size
        middle = [(v, c) for v, c in zip(values, counts) if low < v < high and c > area]
        if middle and threshold is None:
            v, c = max(middle, key=lambda vc: vc[1])
            return None, MaskFinding(path, "ambiguous", (
                f"mask {path} holds the values {{{_shown_values(values)}}}: {v:g} covers {_percent(c / arr.size)} % "
                f"of the pixels, in the middle of its range (above {low:.10g}, below {high:.10g}), so it is neither "
                f"faint background nor an anti-aliased edge (expected a binary mask: 0 and one foreground value)"))
        faint = counts[(values > 0) & (values <= low)].sum() > area
        kind = "middle" if middle else "faint" if faint else "edges"
    cut = full / 2 if threshold is None else threshold
    binary = (arr > cut).astype(np.uint8)
    if not binary.any() and arr.max(initial=0) > (LOSSY_NOISE * full if lossy else 0):
        limit = f"half its range ({cut:g})" if threshold is None else f"--mask_threshold {cut:g}"
        return None, MaskFinding(path, "empty", (
            f"mask {path} would be written empty: its values reach {arr.max():g} ({{{_shown_values(values)}}}) but "
            f"none exceeds {limit}; expected a binary mask with foreground above that"))
    return binary, MaskFinding(path, kind)


def inspect_mask(path: Path, lossy: Optional[bool] = None, threshold: Optional[float] = None) -> MaskFinding:
    """What ``read_binary_mask``'s rule makes of the mask, without raising for the refused kinds."""
    return _apply_rule(path, lossy, threshold)[1]


def read_binary_mask(path: Path, lossy: Optional[bool] = None, threshold: Optional[float] = None) -> np.ndarray:
    """A binary mask as ``(H, W)`` uint8 in {0, 1}, by one rule for every mask file (``lossy``: JPEG, by suffix).

    - Values: the grey value, or the brightest colour channel; alpha where the colour is constant and alpha varies.
    - Labels, kept: palette indices of only 0 and 1; a lossless mask of {0, 1}, or of 0 and one value (or hue).
    - Bands, for other masks, of range R = 255 (65535 for 16-bit masks above 255): at most 25 % of R is background,
      at least 75 % foreground, whatever their share; a middle value is foreground above R / 2 where it covers at
      most 1 % of the pixels (edges).
    - Refused, naming the file: ambiguous, a lossless middle value over 1 % (``{0, 128, 255}``); several classes,
      two or more non-zero low-band values or non-background hues over 1 % each (``{0, 1, 2}``); empty, a non-zero
      mask that would be written empty (JPEG: values above 5 % of R, black's noise).
    - JPEG masks are read by their histogram's levels (``_lossy_levels``): in a grey mask, a middle-band level beside
      another beyond black's noise is ambiguous; else the cut is R / 2. A JPEG within 5 % of R of black is a 0/1
      label if its levels are 0 and 1, else empty; a 0/1/2 label map that dark cannot be told from noise.
    - ``threshold`` (``--mask_threshold``; below 255 for 8-bit, 65535 for 16-bit masks, labels included) replaces
      the bands of non-label masks (foreground above it, middle values allowed); label maps and masks it would
      leave empty are still refused.
    """
    binary, finding = _apply_rule(path, lossy, threshold)
    if finding.refused:
        raise ConversionError(finding.problem)
    return binary


def read_instance_mask_as_binary(path: Path) -> np.ndarray:
    """An instance-label mask (0 background, 1..K objects; colour: any channel, no alpha) as binary ``(H, W)`` uint8."""
    img = _load(_open(path), path)
    if img.mode in ("LA", "RGBA", "PA"):
        img = img.convert("RGB")
    arr = np.asarray(img)
    if arr.ndim == 3:
        arr = arr.max(axis=-1)
    return (arr > 0).astype(np.uint8)


def check_2d_sizes(case: SourceCase) -> None:
    """Image and mask headers are readable and give the same width and height (cheap: no decoding)."""
    with _open(case.image) as image_file, _open(case.label) as mask_file:
        image, mask = image_file.size, mask_file.size
    if image != mask:
        raise ConversionError(f"mask {case.label} is {mask[0]}x{mask[1]} but image {case.image} is "
                              f"{image[0]}x{image[1]} (expected the same size)")


def inspect_case_mask(case: SourceCase, threshold: Optional[float] = None) -> MaskFinding:
    """``inspect_mask`` of a case's mask (the binary 2D datasets' ``DatasetSpec.inspect_mask``)."""
    return inspect_mask(case.label, threshold=threshold)


def write_binary_2d_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int],
                         instance_mask: bool = False, mask_threshold: Optional[float] = None) -> None:
    """Write an RGB PNG and a {0, 1} label PNG, ``resize x resize`` if given; sizes checked by ``check_2d_sizes``."""
    image = read_rgb(case.image)
    if instance_mask:
        mask = read_instance_mask_as_binary(case.label)
    else:
        mask = read_binary_mask(case.label, threshold=mask_threshold)
    mask_img = Image.fromarray(mask, mode="L")
    if resize is not None:
        image = image.resize((resize, resize), Image.Resampling.BILINEAR)
        mask_img = mask_img.resize((resize, resize), Image.Resampling.NEAREST)
        if mask.any() and not np.asarray(mask_img).any():
            raise ConversionError(f"--resize {resize}: the foreground of mask {case.label} ({int(mask.sum())} pixels) "
                                  f"vanishes at {resize}x{resize}: choose a larger --resize")
    image.save(image_file, format="PNG")
    mask_img.save(label_file, format="PNG")
