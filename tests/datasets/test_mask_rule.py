"""The mask rule by value bands (``read_binary_mask``, ``inspect_mask``), on masks made like the published ones.

Every expected mask is computed here from the generated array (which pixels were drawn as foreground), not by the
code under test; the band rule itself is checked against a brute-force reference written from its statement in
docs/data.md on random masks.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nnunetv2_meddisseg.datasets.errors import ConversionError, OptionError
from nnunetv2_meddisseg.datasets.image_io import inspect_mask, read_binary_mask
from nnunetv2_meddisseg.datasets.options import validate_mask_threshold

SIZE = (50, 60)  # 3000 pixels: 1 % is 30 pixels


def _save(tmp_path, array, name, **kwargs):
    path = tmp_path / name
    Image.fromarray(array).save(path, **kwargs)
    return path


def _polyp(shape=SIZE, value=255, dtype=np.uint8) -> np.ndarray:
    """0 background with a filled rectangle of ``value`` (rows 10..29, columns 15..44: 600 pixels, 20 %)."""
    array = np.zeros(shape, dtype)
    array[10:30, 15:45] = value
    return array


FOREGROUND = _polyp(value=1)


def _with_region(array: np.ndarray, value, fraction: float) -> np.ndarray:
    """``array`` with a region of ``value`` covering ``fraction`` of the pixels in its bottom rows (away from the
    foreground rectangle)."""
    out = array.copy()
    n = int(round(fraction * out.shape[0] * out.shape[1]))
    region = out[35:, :].reshape(-1)
    region[:n] = value
    out[35:, :] = region.reshape(out[35:, :].shape)
    return out


# ------------------------------------------------------------------------------------------------
# faint background and middle values (the CVC-ClinicDB PNG re-release)


def test_faint_background_of_11_over_6_percent_is_background(tmp_path):
    array = _with_region(_polyp(), 11, 0.06)
    assert sorted(np.unique(array)) == [0, 11, 255] and (array == 11).mean() == pytest.approx(0.06)
    path = _save(tmp_path, array, "1.png")
    np.testing.assert_array_equal(read_binary_mask(path), FOREGROUND)
    assert inspect_mask(path).kind == "faint" and not inspect_mask(path).refused


@pytest.mark.parametrize("faint", [1, 12, 63])
def test_every_value_of_the_low_band_is_background_whatever_its_share(tmp_path, faint):
    path = _save(tmp_path, _with_region(_polyp(), faint, 0.3), "faint.png")
    np.testing.assert_array_equal(read_binary_mask(path), FOREGROUND)


@pytest.mark.parametrize("bright", [192, 240, 254])
def test_every_value_of_the_high_band_is_foreground_whatever_its_share(tmp_path, bright):
    array = _with_region(_polyp(), bright, 0.2)
    path = _save(tmp_path, array, "bright.png")
    np.testing.assert_array_equal(read_binary_mask(path), (array >= 192).astype(np.uint8))


def test_a_middle_value_of_128_over_6_percent_is_refused_naming_the_file(tmp_path):
    path = _save(tmp_path, _with_region(_polyp(), 128, 0.06), "7.png")
    finding = inspect_mask(path)
    assert finding.refused and finding.kind == "ambiguous"
    with pytest.raises(ConversionError) as e:
        read_binary_mask(path)
    assert str(e.value) == finding.problem == (
        f"mask {path} holds the values {{0, 128, 255}}: 128 covers 6 % of the pixels, in the middle of its range "
        f"(above 63.75, below 191.25), so it is neither faint background nor an anti-aliased edge (expected a binary "
        f"mask: 0 and one foreground value)")


@pytest.mark.parametrize("threshold", [127, 128, 10.5, 0])
def test_mask_threshold_decides_the_middle_value(tmp_path, threshold):
    array = _with_region(_with_region(_polyp(), 128, 0.06)[::-1], 11, 0.05)[::-1]  # 128 at the top, 11 at the bottom
    assert {0, 11, 128, 255} == set(np.unique(array).tolist())
    path = _save(tmp_path, array, "7.png")
    np.testing.assert_array_equal(read_binary_mask(path, threshold=threshold), (array > threshold).astype(np.uint8))
    assert inspect_mask(path, threshold=threshold).kind == "middle"


def test_a_middle_value_of_1_percent_or_less_is_an_edge(tmp_path):
    array = _with_region(_polyp(), 128, 0.01)  # 30 pixels: not more than 1 %
    path = _save(tmp_path, array, "edge.png")
    np.testing.assert_array_equal(read_binary_mask(path), (array > 127.5).astype(np.uint8))
    assert inspect_mask(path).kind == "edges"
    refused = _save(tmp_path, _with_region(_polyp(), 128, 0.0104), "more.png")  # 31 pixels
    assert inspect_mask(refused).kind == "ambiguous"


# ------------------------------------------------------------------------------------------------
# JPEG noise and anti-aliased PNG edges


def _disc(size: int = 64, supersample: int = 8) -> np.ndarray:
    """A disc drawn at ``supersample`` times the size and averaged down: an anti-aliased 0..255 mask."""
    big = size * supersample
    yy, xx = np.mgrid[0:big, 0:big] + 0.5
    inside = ((yy - 0.45 * big) ** 2 + (xx - 0.55 * big) ** 2 <= (0.3 * big) ** 2).astype(np.float64)
    small = inside.reshape(size, supersample, size, supersample).mean(axis=(1, 3))
    return np.rint(small * 255).astype(np.uint8)


def test_anti_aliased_png_edges_are_thresholded_at_half_their_range(tmp_path):
    array = _disc()
    between = array[(array > 0) & (array < 255)]
    assert len(np.unique(between)) > 10 and np.any((between > 63) & (between < 192))  # a real soft edge
    path = _save(tmp_path, array, "disc.png")
    np.testing.assert_array_equal(read_binary_mask(path), (array > 127).astype(np.uint8))
    assert inspect_mask(path).kind == "edges"


def test_jpeg_noise_is_thresholded_never_refused(tmp_path):
    array = _with_region(_disc(), 11, 0.06)
    path = _save(tmp_path, array, "noisy.jpg", quality=70)
    decoded = np.asarray(Image.open(path))
    assert len(np.unique(decoded)) > 20  # JPEG really spread the values
    np.testing.assert_array_equal(read_binary_mask(path), (decoded > 127).astype(np.uint8))
    assert inspect_mask(path).kind == "lossy"
    # the decoded foreground is the drawn one except near edges
    assert np.mean(read_binary_mask(path) != (array > 127)) < 0.02


def _mixed_blocks(mask: np.ndarray) -> np.ndarray:
    """The pixels of the 8x8 JPEG blocks of ``mask`` that hold both classes: JPEG's noise lies in them (a block of
    one value keeps only its mean)."""
    height, width = mask.shape
    blocks = np.pad(mask > 0, ((0, -height % 8), (0, -width % 8)), mode="edge")
    blocks = blocks.reshape(blocks.shape[0] // 8, 8, blocks.shape[1] // 8, 8)
    mixed = blocks.any(axis=(1, 3)) & ~blocks.all(axis=(1, 3))
    return np.repeat(np.repeat(mixed, 8, axis=0), 8, axis=1)[:height, :width]


@pytest.mark.parametrize("quality, at_most", [(75, 0.07), (90, 0.02), (100, 0.005)])
@pytest.mark.parametrize("shape", ["polyp", "disc", "rgb_disc"])
def test_a_jpeg_of_a_0_1_mask_is_read_as_0_1(tmp_path, quality, at_most, shape):
    intended = {"polyp": FOREGROUND, "disc": (_disc() > 127).astype(np.uint8)}[shape.replace("rgb_", "")]
    array = np.repeat(intended[..., None], 3, axis=-1) if shape.startswith("rgb") else intended
    path = _save(tmp_path, array, f"{shape}.jpg", quality=quality)
    decoded = np.asarray(Image.open(path))
    assert decoded.max() <= 2 and (decoded == 1).any()  # 0/1 with JPEG's noise: nothing reaches half the range
    binary = read_binary_mask(path)
    wrong = binary != intended
    assert not (wrong & ~_mixed_blocks(intended)).any()  # off only in the blocks the drawn edge crosses
    assert wrong.mean() <= at_most
    assert inspect_mask(path).kind == "lossy_label" and not inspect_mask(path).refused
    np.testing.assert_array_equal(read_binary_mask(path, threshold=127), binary)  # a label: the threshold is moot


def _jpeg_label_map(values) -> np.ndarray:
    """Background 0, a band of ``values[0]`` (13 % of the pixels) and a rectangle of ``values[1]`` (20 %)."""
    array = np.zeros(SIZE, np.uint8)
    array[2:10, 10:59] = values[0]
    array[20:40, 15:45] = values[1]
    return array


@pytest.mark.parametrize("quality", [75, 95])
@pytest.mark.parametrize("values", [(100, 200), (128, 255), (255, 128)])
def test_a_jpeg_label_map_with_a_middle_level_is_refused_as_the_png_one(tmp_path, values, quality):
    array = _jpeg_label_map(values)
    png = inspect_mask(_save(tmp_path, array, "map.png"))
    assert png.kind == "ambiguous"
    path = _save(tmp_path, array, "map.jpg", quality=quality)
    finding = inspect_mask(path)
    assert finding.refused and finding.kind == "ambiguous"
    assert finding.problem.startswith(f"mask {path} holds the levels {{0 (")
    found = re.search(r": (\d+) covers ([\d.]+) % of the pixels, in the middle of its range \(above 63.75, below "
                      r"191.25\), so it is neither faint background nor an anti-aliased edge", finding.problem)
    middle = min(values)  # JPEG may move a level by a step or two: the message names the level it found
    assert found and abs(int(found.group(1)) - middle) <= 2
    assert float(found.group(2)) == pytest.approx(100 * np.mean(array == middle), abs=1.5)
    with pytest.raises(ConversionError) as e:
        read_binary_mask(path)
    assert str(e.value) == finding.problem and "\n" not in finding.problem
    decoded = np.asarray(Image.open(path))
    np.testing.assert_array_equal(read_binary_mask(path, threshold=150), (decoded > 150).astype(np.uint8))


# ------------------------------------------------------------------------------------------------
# the cases the rule kept before: colour, alpha-only, 16-bit, palette indices, empty masks


def test_blue_mask_with_a_faint_blue_background(tmp_path):
    array = np.zeros(SIZE + (3,), np.uint8)
    array[..., 2] = _with_region(_polyp(), 11, 0.06)
    path = _save(tmp_path, array, "blue.png")
    np.testing.assert_array_equal(read_binary_mask(path), FOREGROUND)
    assert inspect_mask(path).kind == "faint"


def test_alpha_only_mask_with_a_faint_and_a_middle_alpha(tmp_path):
    array = np.zeros(SIZE + (4,), np.uint8)
    array[..., 3] = _with_region(_polyp(), 11, 0.06)
    np.testing.assert_array_equal(read_binary_mask(_save(tmp_path, array, "alpha.png")), FOREGROUND)
    array[..., 3] = _with_region(_polyp(), 128, 0.06)
    assert inspect_mask(_save(tmp_path, array, "alpha_mid.png")).kind == "ambiguous"


def test_16_bit_masks_use_the_16_bit_range(tmp_path):
    faint = _with_region(_polyp(value=65535, dtype=np.uint16), 2800, 0.06)  # 4 % of the range
    np.testing.assert_array_equal(read_binary_mask(_save(tmp_path, faint, "faint16.png")), FOREGROUND)
    middle = _with_region(_polyp(value=65535, dtype=np.uint16), 32768, 0.06)
    path = _save(tmp_path, middle, "middle16.png")
    with pytest.raises(ConversionError, match=r"32768 covers 6 % of the pixels, in the middle of its range \(above "
                                              r"16383.75, below 49151.25\)"):
        read_binary_mask(path)
    np.testing.assert_array_equal(read_binary_mask(path, threshold=30000), (middle > 30000).astype(np.uint8))


def test_palette_indices_and_plain_labels_stay_labels(tmp_path):
    img = Image.fromarray(_polyp(value=1), "P")
    img.putpalette([0, 0, 0, 11, 0, 0] + [0] * 762)  # index 1 is a faint red: still the label 1
    img.save(tmp_path / "p.png")
    np.testing.assert_array_equal(read_binary_mask(tmp_path / "p.png", threshold=127), FOREGROUND)
    # 0 and one value: that label, whatever the value and whatever --mask_threshold says
    path = _save(tmp_path, _polyp(value=11), "eleven.png")
    np.testing.assert_array_equal(read_binary_mask(path), FOREGROUND)
    np.testing.assert_array_equal(read_binary_mask(path, threshold=127), FOREGROUND)
    assert inspect_mask(path).kind == "label"


def test_a_mask_that_would_come_out_empty_is_refused_naming_its_values(tmp_path):
    dim = _with_region(_with_region(np.zeros(SIZE, np.uint8), 11, 0.5)[::-1], 100, 0.005)  # 11 wide, 100 tiny
    path = _save(tmp_path, dim, "dim.png")
    finding = inspect_mask(path)
    assert finding.kind == "empty" and finding.problem == (
        f"mask {path} would be written empty: its values reach 100 ({{0, 11, 100}}) but none exceeds half its range "
        f"(127.5); expected a binary mask with foreground above that")
    np.testing.assert_array_equal(read_binary_mask(path, threshold=50), (dim > 50).astype(np.uint8))
    with pytest.raises(ConversionError, match="none exceeds --mask_threshold 120;"):
        read_binary_mask(path, threshold=120)
    jpeg = _save(tmp_path, _polyp(value=100), "dark.jpg", quality=100)
    assert inspect_mask(jpeg).kind == "empty"


# ------------------------------------------------------------------------------------------------
# --mask_threshold values


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 65535, True, "127"])
def test_bad_mask_thresholds_are_one_line_errors(value):
    with pytest.raises(OptionError) as e:
        validate_mask_threshold(value)
    assert str(e.value) == (f"--mask_threshold must be a number from 0 to below 65535 (foreground: the mask values "
                            f"above it, e.g. 127 for 8-bit masks), got {value!r}")


@pytest.mark.parametrize("value", [None, 0, 127, 127.5, np.float32(30000), 65534])
def test_good_mask_thresholds_pass(value):
    validate_mask_threshold(value)


def test_a_threshold_at_or_above_the_range_of_a_mask_names_both(tmp_path):
    path = _save(tmp_path, _with_region(_polyp(), 128, 0.06), "m.png")
    with pytest.raises(OptionError) as e:
        read_binary_mask(path, threshold=255)
    assert str(e.value) == (f"--mask_threshold 255 is not below the range of mask {path} (0..255): expected a value "
                            f"between 0 and 255")


# ------------------------------------------------------------------------------------------------
# masks that a binary dataset would get wrong with success: faint-only masks, label maps, thresholds beyond the range


def _aa_disc(value: int, dtype=np.uint8) -> np.ndarray:
    """:func:`_disc` drawn with ``value`` instead of 255 (its anti-aliased edge scaled alike)."""
    return np.rint(_disc().astype(np.float64) / 255 * value).astype(dtype)


@pytest.mark.parametrize("name, array, options", [
    ("faint_40.png", _aa_disc(40), {}),
    ("faint_63.png", _aa_disc(63), {}),
    ("faint_12.png", _aa_disc(12), {}),
    ("faint_16bit_10000.png", _aa_disc(10000, np.uint16), {}),
    ("faint_16bit_300.png", _aa_disc(300, np.uint16), {}),  # values above 255: the 16-bit range
    ("faint_40.jpg", np.where(_disc() > 127, 40, 0).astype(np.uint8), {"quality": 90}),
    ("faint_60.jpg", _aa_disc(60), {"quality": 75}),
])
def test_a_foreground_drawn_in_the_faint_band_is_refused_not_written_empty(tmp_path, name, array, options):
    path = _save(tmp_path, array, name, **options)
    values = np.unique(np.asarray(Image.open(path)))
    assert len(values) > 2 and values.max() > 0  # not a plain label: the bands decide
    finding = inspect_mask(path)
    assert finding.refused and finding.kind == "empty"
    assert finding.problem.startswith(f"mask {path} would be written empty: its values reach {values.max():g} (")
    assert "but none exceeds half its range" in finding.problem
    with pytest.raises(ConversionError, match="would be written empty"):
        read_binary_mask(path)


def test_a_jpeg_of_an_empty_mask_with_noise_around_black_stays_empty(tmp_path):
    noise = np.zeros(SIZE, np.uint8)
    noise[::7, ::5] = 9  # up to 5 % of the range: the format's noise around black
    path = _save(tmp_path, noise, "noise.jpg", quality=95)
    decoded = np.asarray(Image.open(path))
    assert 0 < decoded.max() <= 0.05 * 255
    assert not read_binary_mask(path).any() and inspect_mask(path).kind == "lossy"


def _label_map(classes: int, dtype=np.uint8) -> np.ndarray:
    """0 background and classes 1..classes-1 as horizontal bands, each over 10 % of the pixels."""
    array = np.zeros(SIZE, dtype)
    for k in range(1, classes):
        array[5 * k:5 * k + 5, 10:50] = k
    return array


@pytest.mark.parametrize("name, array", [
    ("map_012.png", _label_map(3)),
    ("map_0123.png", _label_map(4)),
    ("map_012_16bit.png", _label_map(3, np.uint16)),
    ("map_0123_16bit.png", _label_map(4, np.uint16)),
    ("map_faint_noise.png", _with_region(_with_region(np.zeros(SIZE, np.uint8), 11, 0.5), 12, 0.1)),
])
@pytest.mark.parametrize("threshold", [None, 0, 1.5])
def test_a_label_map_of_more_classes_is_refused_whatever_the_threshold(tmp_path, name, array, threshold):
    path = _save(tmp_path, array, name)
    values = sorted(np.unique(array).tolist())
    finding = inspect_mask(path, threshold=threshold)
    assert finding.kind == "classes" and finding.refused
    shown = ", ".join(map(str, values))
    assert finding.problem.startswith(f"mask {path} holds the values {{{shown}}}: ")
    assert f"a label map of {len(values)} classes (a binary dataset has 2: background and one foreground)" in \
           finding.problem
    with pytest.raises(ConversionError, match="a label map of"):
        read_binary_mask(path, threshold=threshold)


def _palette_mask(indices: np.ndarray, colours) -> Image.Image:
    img = Image.fromarray(indices, "P")
    img.putpalette([c for colour in colours for c in colour] + [0] * (768 - 3 * len(colours)))
    return img


@pytest.mark.parametrize("name, image", [
    ("red_green.png", Image.fromarray(np.stack([_label_map(3) == 1, _label_map(3) == 2, np.zeros(SIZE, bool)],
                                               axis=-1).astype(np.uint8) * 255)),
    ("voc_palette.png", _palette_mask(_label_map(3), [(0, 0, 0), (128, 0, 0), (0, 128, 0)])),
    ("bright_palette.png", _palette_mask(_label_map(4), [(0, 0, 0), (255, 0, 0), (0, 255, 0), (0, 0, 255)])),
    ("white_and_red.png", _palette_mask(_label_map(3), [(0, 0, 0), (255, 255, 255), (255, 0, 0)])),
])
@pytest.mark.parametrize("threshold", [None, 100])
def test_a_colour_label_map_is_refused_not_merged_into_one_foreground(tmp_path, name, image, threshold):
    image.save(tmp_path / name)
    finding = inspect_mask(tmp_path / name, threshold=threshold)
    assert finding.kind == "classes"
    assert "colours of different hues that each cover more than 1 % of the pixels" in finding.problem
    assert "(expected" not in finding.problem and finding.problem.endswith("(0 and one foreground colour)")


def test_one_colour_with_anti_aliased_edges_and_a_grey_palette_stay_one_class(tmp_path):
    red = np.zeros(SIZE + (3,), np.uint8)
    red[..., 0] = _disc(64, 8)[:SIZE[0], :SIZE[1]]  # red at every edge level: one hue
    np.testing.assert_array_equal(read_binary_mask(_save(tmp_path, red, "red_edges.png")), (red[..., 0] > 127))
    grey = _palette_mask(np.where(_polyp(value=1) > 0, 2, 0).astype(np.uint8), [(0, 0, 0), (9, 9, 9), (255, 255, 255)])
    grey.save(tmp_path / "grey_palette.png")
    np.testing.assert_array_equal(read_binary_mask(tmp_path / "grey_palette.png"), FOREGROUND)


def _palette_label(tmp_path) -> Path:
    _palette_mask(_polyp(value=1), [(0, 0, 0), (255, 0, 0)]).save(tmp_path / "palette01.png")
    return tmp_path / "palette01.png"


#: masks of every kind -> the range of their file's values (``--mask_threshold`` must lie below it)
MASK_KINDS_AND_RANGES = {
    "label_0_255.png": (lambda tmp: _save(tmp, _polyp(), "label_0_255.png"), 255),
    "label_0_1.png": (lambda tmp: _save(tmp, _polyp(value=1), "label_0_1.png"), 255),
    "label_16bit_0_1.png": (lambda tmp: _save(tmp, _polyp(value=1, dtype=np.uint16), "label_16bit_0_1.png"), 65535),
    "palette01.png": (_palette_label, 255),
    "rgb_label.png": (lambda tmp: _save(tmp, np.repeat(_polyp()[..., None], 3, axis=-1), "rgb_label.png"), 255),
    "edges.png": (lambda tmp: _save(tmp, _disc(), "edges.png"), 255),
    "mask.jpg": (lambda tmp: _save(tmp, _disc(), "mask.jpg"), 255),
    "label_16bit_0_65535.png": (lambda tmp: _save(tmp, _polyp(value=65535, dtype=np.uint16),
                                                  "label_16bit_0_65535.png"), 65535),
}


@pytest.mark.parametrize("kind", list(MASK_KINDS_AND_RANGES))
def test_mask_threshold_must_lie_below_the_range_of_every_mask_kind(tmp_path, kind):
    make, full = MASK_KINDS_AND_RANGES[kind]
    path = make(tmp_path)
    for threshold in (full, full + 45, 300) if full == 255 else (full,):
        with pytest.raises(OptionError) as e:
            inspect_mask(path, threshold=threshold)
        assert str(e.value) == (f"--mask_threshold {threshold:g} is not below the range of mask {path} (0..{full}): "
                                f"expected a value between 0 and {full}")
    assert inspect_mask(path, threshold=full - 1.5).kind in ("label", "edges", "lossy")  # just below: accepted
    if full == 65535:  # a 16-bit label takes any T of the 16-bit range
        np.testing.assert_array_equal(read_binary_mask(path, threshold=300), FOREGROUND)


def test_a_threshold_within_the_16_bit_range_still_refuses_what_it_would_leave_empty(tmp_path):
    faint = _save(tmp_path, _with_region(_polyp(value=200, dtype=np.uint16), 90, 0.05), "low16.png")  # {0, 90, 200}
    with pytest.raises(ConversionError, match=r"would be written empty: its values reach 200 \(\{0, 90, 200\}\) but "
                                              r"none exceeds --mask_threshold 300"):
        read_binary_mask(faint, threshold=300)
    empty = _save(tmp_path, np.zeros(SIZE, np.uint16), "empty16.png")
    assert not read_binary_mask(empty, threshold=30000).any()


# ------------------------------------------------------------------------------------------------
# the rule against a brute-force reference of its statement


def _reference(arr: np.ndarray, full: int):
    """docs/data.md's rule, pixel by pixel: None where the mask is refused."""
    values = sorted(set(arr.reshape(-1).tolist()))
    if values == [0] or values == [0, 1] or values == [1] or (len(values) == 2 and values[0] == 0):
        return (arr > 0).astype(np.uint8)
    out = np.zeros(arr.shape, np.uint8)
    for v in values:
        share = float(np.mean(arr == v))
        if v <= full / 4:
            continue
        if v >= 3 * full / 4:
            out[arr == v] = 1
        elif share > 0.01:
            return None  # a middle value covering an area
        elif v > full / 2:
            out[arr == v] = 1
    if not out.any() and max(values) > 0:
        return None  # non-zero values, written empty
    return out


def _random_mask(seed: int) -> np.ndarray:
    """40x40 (1 % = 16 pixels): a 0/255 mask with 1..4 further values, each on 1..40 random pixels."""
    rng = np.random.default_rng(seed)
    array = np.where(rng.random((40, 40)) < rng.uniform(0, 0.6), 255, 0).astype(np.uint8)
    flat = array.reshape(-1)
    for value in rng.integers(1, 255, size=rng.integers(1, 5)):
        flat[rng.choice(flat.size, size=rng.integers(1, 41), replace=False)] = value
    return array


def test_the_random_masks_cover_every_outcome():
    outcomes = [_reference(_random_mask(seed), 255) for seed in range(40)]
    refused = sum(o is None for o in outcomes)
    assert 5 <= refused <= 35
    assert any(o is not None and len(np.unique(_random_mask(s))) > 3 for s, o in enumerate(outcomes))


@pytest.mark.parametrize("seed", range(40))
def test_the_rule_matches_its_statement_on_random_masks(tmp_path, seed):
    array = _random_mask(seed)
    path = _save(tmp_path, array, f"r{seed}.png")
    expected = _reference(array, 255)
    if expected is None:
        assert inspect_mask(path).refused
        with pytest.raises(ConversionError, match=str(path)):
            read_binary_mask(path)
    else:
        np.testing.assert_array_equal(read_binary_mask(path), expected)
