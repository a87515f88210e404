"""Reading source images and masks (PIL; masks by one rule, :func:`read_binary_mask`), and writing a binary 2D
case as nnU-Net PNGs."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from .cases import MaskFinding, SourceCase
from .errors import ConversionError, MissingSourceError, OptionError

__all__ = ["LOSSY_SUFFIXES", "image_size", "read_rgb", "read_binary_mask", "inspect_mask",
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


def image_size(path: Path) -> Tuple[int, int]:
    """``(width, height)`` from the file header (cheap: no decoding)."""
    with _open(path) as img:
        return img.size


#: PIL modes of images with more than 8 bits per value (16-bit and 32-bit integers, 32-bit float)
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


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


def _mask_values(img: Image.Image, path: Path) -> Tuple[np.ndarray, int, Optional[np.ndarray]]:
    """One value per pixel of a mask, its full range (see :func:`read_binary_mask` for the rule) and, for colour
    masks (RGB, palette; RGBA / LA unless alpha is the mask), the ``(H, W, C)`` colours the values come from."""
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


#: the mask rule's bands, as fractions of a lossless mask's range R: values at or below BACKGROUND_BAND * R are
#: background and values at or above FOREGROUND_BAND * R foreground, whatever their share of the mask
BACKGROUND_BAND = 0.25
FOREGROUND_BAND = 0.75
#: a value of the middle band (between the two) that covers more than this fraction of a lossless mask is a
#: label of its own (a second class, 'uncertain'), not an anti-aliased edge; faint background values that
#: together cover more than this fraction are reported as faint background
AMBIGUOUS_FRACTION = 0.01
#: JPEG masks: the noise tolerance, as a fraction of the range: values up to it from a level of the histogram are
#: that level's noise (:func:`_lossy_levels`), and a JPEG mask whose values stay within it of black is an empty
#: mask (not a foreground drawn too dark) unless it is a 0/1 label (:func:`_lossy_01_label`)
LOSSY_NOISE = 0.05
#: JPEG masks: the steps around a level of the histogram within which JPEG keeps a flat region of that value
_LOSSY_CORE = 2
#: the classes of a binary dataset's masks: background and one foreground
BINARY_CLASSES = 2
#: colours whose channels, scaled by their brightest channel, agree to within this step are one hue (one class
#: drawn with anti-aliased or darker edges); colours of different hues are different classes
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
    """The hues of a colour mask that are not background (brightest channel above ``low``) and each cover more than
    :data:`AMBIGUOUS_FRACTION` of the pixels: ``[(the hue's most frequent colour, share)]``, largest first."""
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
    """Why a lossless mask holds more classes than a binary dataset (a label map), or None: two or more non-zero
    values of the low band (at most 25 % of the range) that each cover more than 1 % of the mask (``{0, 1, 2}``:
    the rule would read every one as background), or two or more colour hues, not background, that each do."""
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
    """The levels of a lossy mask's histogram: ``[(level, share of the pixels in its band)]`` by level.

    JPEG keeps a flat region of one value at that value, give or take a step or two (:data:`_LOSSY_CORE`), and
    spreads the pixels near edges thinly over the values in between. So a level is a value whose core, the values
    within two steps of it, holds more than :data:`AMBIGUOUS_FRACTION` of the pixels, and that is the most
    frequent value within the noise tolerance t (:data:`LOSSY_NOISE` of the range: 12.75 of 255) around it; its
    band is the values within t of it. Levels are taken from the most frequent value down; a value within 2 t of
    a level taken lies in that level's band or an edge beside it (JPEG can move a small region's values by more
    than t), so levels closer than 2 t are not told apart. The core, not the value alone, is counted because JPEG
    spreads a flat region of a middle value (128) over its neighbours (127, 129).
    """
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
    """Whether a lossy mask whose values all lie within the noise tolerance of black is a 0/1 label: its two most
    frequent values are 0 and 1, each over :data:`AMBIGUOUS_FRACTION` of the pixels, and the values above 2 hold
    at most that fraction together. The contrast of a 0/1 mask is one step, so JPEG leaves it at 0 and 1 with
    edge pixels one step off (2, or 0 inside); the noise of a brighter drawing spreads further from black."""
    n = counts.sum()
    top = values[np.argsort(-counts, kind="stable")[:2]]
    return (sorted(top.tolist()) == [0, 1] and counts[values <= 1].min() > AMBIGUOUS_FRACTION * n
            and counts[values > 2].sum() <= AMBIGUOUS_FRACTION * n)


def _shown_levels(levels: List[Tuple[float, float]]) -> str:
    return ", ".join(f"{level:g} ({_percent(share)} %)" for level, share in levels)


def _grey(colours: Optional[np.ndarray], tol: float) -> bool:
    """Whether a mask is grey: no colours (grey, 16-bit, alpha), or colours whose channels differ by more than
    ``tol`` in at most :data:`AMBIGUOUS_FRACTION` of the pixels (a grey RGB JPEG's colour noise). JPEG stores
    colour at half the resolution, which smears a coloured mask's edges over every value of its brightest
    channel; the levels of such a mask are not read (:func:`_lossy_levels`)."""
    if colours is None:
        return True
    spread = colours.max(axis=-1).astype(np.int16) - colours.min(axis=-1)
    return np.count_nonzero(spread > tol) <= AMBIGUOUS_FRACTION * spread.size


def _lossy_ambiguous(path: Path, levels: List[Tuple[float, float]], full: int) -> Optional[MaskFinding]:
    """The ambiguous finding of a lossy mask by its levels (:func:`_lossy_levels`), or None: a level of the middle
    band beside another level beyond black's noise, as a lossless mask's middle value over 1 % of the pixels
    (``{0, 128, 255}``, ``{0, 100, 200}``). Black and one level alone are cut at half the range (a JPEG of a faint
    drawing is refused as empty). Levels all in the low band are not read as a label map: the half-range cut
    leaves such a mask empty, which refuses it, and the edges of a faint drawing spread over so few values that
    their band may pass for a level."""
    tol, low, high = LOSSY_NOISE * full, BACKGROUND_BAND * full, FOREGROUND_BAND * full
    beyond = [level for level, _ in levels if level > tol]
    middle = [(level, share) for level, share in levels if low < level < high]
    if not middle or len(beyond) < BINARY_CLASSES:
        return None
    level, share = max(middle, key=lambda ls: ls[1])
    return MaskFinding(path, "ambiguous", (
        f"mask {path} holds the levels {{{_shown_levels(levels)}}} (a lossy mask: each level with the values within "
        f"{tol:g} of it, its noise): {level:g} covers {_percent(share)} % of the pixels, in the middle of its range "
        f"(above {low:.10g}, below {high:.10g}), so it is neither faint background nor an anti-aliased edge "
        f"(expected a binary mask: 0 and one foreground value)"))


def _apply_rule(path: Path, lossy: Optional[bool], threshold: Optional[float]) -> Tuple[Optional[np.ndarray],
                                                                                          MaskFinding]:
    """The rule of :func:`read_binary_mask`: the ``(H, W)`` uint8 {0, 1} mask (None where refused) and the finding."""
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
    if not lossy:
        several = _several_classes(path, values, counts, arr, colours, low)
        if several:
            return None, MaskFinding(path, "classes", several)
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
    """What :func:`read_binary_mask`'s rule makes of the mask, without raising for the refused kinds."""
    return _apply_rule(path, lossy, threshold)[1]


def read_binary_mask(path: Path, lossy: Optional[bool] = None, threshold: Optional[float] = None) -> np.ndarray:
    """A binary mask as ``(H, W)`` uint8 in {0, 1}, by one rule for every kind of mask file.

    - One value per pixel: grey and 16-bit masks their value; RGB (and palette colours) the brightest
      of its channels, so pure red, green or blue count; RGBA / LA the same, except that where the
      colour is one value everywhere and alpha varies, alpha is the mask. Palette masks whose indices
      are only 0 and 1 are labels as they are.
    - Labels: a lossless mask holding only {0, 1}, or 0 and one other value (in colour masks: of one
      hue), is that label.
    - Bands, for every other mask, of range R = 255 (65535 for 16-bit masks with values above 255):
      values at or below 25 % of R are background and values at or above 75 % of R foreground,
      whatever their share of the mask (faint non-zero background, JPEG noise); values of the middle
      band are foreground above half the range (> 127 for 8 bit, > 32767 for 16 bit) where each
      covers at most 1 % of the pixels (anti-aliased edges, JPEG edges).
    - Refused, naming the file and its values:
      - ambiguous: a lossless mask in which one value of the middle band covers more than 1 % of the
        pixels (``{0, 128, 255}``: a second class, or 'uncertain'?);
      - several classes: a lossless mask whose values all lie at or below 25 % of R with two or more
        non-zero values each over 1 % of the pixels (a label map ``{0, 1, 2}``), or a colour mask with
        two or more hues, not background, each over 1 % (red and green classes);
      - empty: a mask with non-zero values that would be written empty (JPEG masks: values above 5 %
        of R, the format's noise around black).
    - Lossy (JPEG) masks, whose values JPEG spreads around each drawn value and over edges, are read by
      the levels of their histogram instead of single values (:func:`_lossy_levels`: each level with the
      values within 5 % of R of it, its noise; the values within two steps of a level hold over 1 % of
      the pixels): in a grey mask, a middle-band level beside another level beyond black's noise is
      ambiguous (``{0, 128, 255}``, ``{0, 100, 200}``); otherwise the mask is cut at half the range (black
      and one faint level: refused as empty). A JPEG
      whose values all lie within 5 % of R of black is a 0/1 label where its levels are 0 and 1
      (:func:`_lossy_01_label`: foreground from 1 up), else noise around black (empty). A JPEG of a label
      map whose values all lie that close to black (0/1/2) cannot be told from that noise.
    - ``threshold`` (``--mask_threshold T``, below 255 for every 8-bit mask and 65535 for every 16-bit
      one, labels included) replaces the bands for every mask that is not a label: foreground is every
      value above T, and middle values are no longer refused; masks of several classes, and masks it
      would leave empty, still are.

    ``lossy`` (JPEG: noisy edges and background) is decided by the file suffix by default.
    """
    binary, finding = _apply_rule(path, lossy, threshold)
    if finding.refused:
        raise ConversionError(finding.problem)
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


def inspect_case_mask(case: SourceCase, threshold: Optional[float] = None) -> MaskFinding:
    """:func:`inspect_mask` of a case's mask (``DatasetSpec.inspect_mask`` of the binary 2D datasets)."""
    return inspect_mask(case.label, threshold=threshold)


def write_binary_2d_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int],
                         instance_mask: bool = False, mask_threshold: Optional[float] = None) -> None:
    """Write an RGB PNG image and a {0, 1} label PNG, optionally resized to ``resize x resize``
    (image bilinear, mask nearest neighbour after binarisation); ``mask_threshold``: see
    :func:`read_binary_mask`."""
    image = read_rgb(case.image)
    if instance_mask:
        mask = read_instance_mask_as_binary(case.label)
    else:
        mask = read_binary_mask(case.label, threshold=mask_threshold)
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
