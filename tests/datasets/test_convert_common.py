"""Converter helpers: mask binarisation, seeded splits, split files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from nnunetv2_meddisseg.datasets.errors import ConversionError, OptionError
from nnunetv2_meddisseg.datasets.image_io import read_binary_mask, read_instance_mask_as_binary
from nnunetv2_meddisseg.datasets.split_lists import holdout_count, make_seeded_split, read_split_file


def _mask(tmp_path, array, name, mode=None, **save_kwargs):
    path = tmp_path / name
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(path, **save_kwargs)
    return path


def _edged(dtype, below: int, above: int, full: int) -> np.ndarray:
    """10x10: background above, foreground below, and an anti-aliased edge of one value each side."""
    array = np.zeros((10, 10), dtype)
    array[5:] = full
    array[4, 3] = below
    array[5, 6] = above
    return array


@pytest.mark.parametrize("name, array, mode, expected", [
    ("zero_one.png", np.array([[0, 1], [1, 0]], np.uint8), None, [[0, 1], [1, 0]]),
    ("zero_255.png", np.array([[0, 255], [255, 0]], np.uint8), None, [[0, 1], [1, 0]]),
    ("antialiased.png", _edged(np.uint8, 127, 128, 255), None, [[0] * 10] * 5 + [[1] * 10] * 5),
    ("sixteen_bit.png", _edged(np.uint16, 32767, 32768, 65535), None, [[0] * 10] * 5 + [[1] * 10] * 5),
    ("eight_bit_in_16.png", np.array([[0, 255], [255, 0]], np.uint16), None, [[0, 1], [1, 0]]),
    ("rgb.png", np.array([[[0, 0, 0], [255, 255, 255]], [[255, 255, 255], [0, 0, 0]]], np.uint8), None,
     [[0, 1], [1, 0]]),
    ("one_bit.png", np.array([[False, True], [True, False]]), None, [[0, 1], [1, 0]]),  # mode "1"
])
def test_lossless_masks(tmp_path, name, array, mode, expected):
    np.testing.assert_array_equal(read_binary_mask(_mask(tmp_path, array, name, mode)), np.array(expected, np.uint8))


def test_palette_mask_uses_its_indices(tmp_path):
    img = Image.fromarray(np.array([[0, 1], [1, 0]], np.uint8), "P")
    img.putpalette([0, 0, 0, 128, 0, 0] + [0] * 762)  # index 1 is dark red (grey value 38)
    img.save(tmp_path / "p.png")
    np.testing.assert_array_equal(read_binary_mask(tmp_path / "p.png"), [[0, 1], [1, 0]])


def test_jpeg_mask_is_thresholded_even_when_it_looks_like_labels(tmp_path):
    """A JPEG mask of one value near black is noise around black (JPEG may round an empty mask to all 1)."""
    path = _mask(tmp_path, np.ones((16, 16), np.uint8), "dark.jpg", quality=100)
    assert set(np.unique(np.asarray(Image.open(path)))) <= {0, 1, 2}
    assert read_binary_mask(path).max() == 0


def test_instance_mask_becomes_binary(tmp_path):
    path = _mask(tmp_path, np.array([[0, 1, 2], [7, 0, 255]], np.uint8), "anno.bmp")
    np.testing.assert_array_equal(read_instance_mask_as_binary(path), [[0, 1, 1], [1, 0, 1]])


def test_seeded_split_is_reproducible_disjoint_and_sized():
    ids = [f"c{i:03d}" for i in range(50)]
    a = make_seeded_split(reversed(ids), n_val=5, n_test=10, seed=7)
    assert a == make_seeded_split(ids, n_val=5, n_test=10, seed=7)  # input order does not matter
    train, val, test = a
    assert (len(train), len(val), len(test)) == (35, 5, 10)
    assert sorted(train + val + test) == ids
    assert make_seeded_split(ids, 5, 10, seed=8) != a
    # the documented rule, worked out independently: permutation of the sorted IDs, test first
    order = np.random.RandomState(7).permutation(50)
    assert test == sorted(ids[i] for i in order[:10]) and val == sorted(ids[i] for i in order[10:15])
    with pytest.raises(ValueError):
        make_seeded_split(ids, 30, 30)


@pytest.mark.parametrize("n, expected", [(0, 0), (1, 0), (2, 1), (18, 2), (85, 8), (880, 88), (900, 90), (2000, 200)])
def test_holdout_count(n, expected):
    assert holdout_count(n) == expected


def test_split_file_reading(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"train": ["a", "b"], "test": ["c"], "description": "mine"}))
    assert read_split_file(path) == (["a", "b"], [], ["c"])
    for content, message in [({"train": ["a", "a"]}, "appears twice"), ({"training": ["a"]}, "unknown key"),
                             ({"train": "a"}, "must be a list"), ({}, "lists no cases"), ([["a"]], "JSON object")]:
        path.write_text(json.dumps(content))
        with pytest.raises(OptionError, match=message):
            read_split_file(path)
    with pytest.raises(OptionError, match="does not exist"):
        read_split_file(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------------------
# the mask rule (read_binary_mask's docstring, docs/data.md's "Masks and images") one case each


def _foreground_square(value, shape=(10, 10), dtype=np.uint8) -> np.ndarray:
    array = np.zeros(shape, dtype)
    array[2:6, 3:8] = value
    return array


SQUARE = _foreground_square(1)


@pytest.mark.parametrize("name, colour", [("red.png", (255, 0, 0)), ("blue.png", (0, 0, 255)),
                                          ("dark_green.png", (0, 140, 0))])
def test_colour_masks_count_their_brightest_channel(tmp_path, name, colour):
    path = _mask(tmp_path, _foreground_square(colour, (10, 10, 3)), name)
    np.testing.assert_array_equal(read_binary_mask(path), SQUARE)


def test_rgba_mask_with_the_foreground_in_alpha(tmp_path):
    array = np.zeros((10, 10, 4), np.uint8)
    array[..., 3] = _foreground_square(255)
    np.testing.assert_array_equal(read_binary_mask(_mask(tmp_path, array, "alpha.png")), SQUARE)


def test_rgba_mask_with_the_foreground_in_colour_ignores_alpha(tmp_path):
    array = np.zeros((10, 10, 4), np.uint8)
    array[..., 0] = _foreground_square(255)
    array[..., 3] = 255
    np.testing.assert_array_equal(read_binary_mask(_mask(tmp_path, array, "rgba.png")), SQUARE)


def test_palette_mask_with_other_indices_uses_its_colours(tmp_path):
    img = Image.fromarray(_foreground_square(3), "P")
    img.putpalette([0, 0, 0] * 3 + [0, 0, 255] + [0] * 756)  # index 3 is pure blue (grey value 29)
    img.save(tmp_path / "p3.png")
    np.testing.assert_array_equal(read_binary_mask(tmp_path / "p3.png"), SQUARE)


@pytest.mark.parametrize("value, dtype", [(50, np.uint8), (1000, np.uint16), (7, np.uint16)])
def test_lossless_mask_with_zero_and_one_other_value(tmp_path, value, dtype):
    path = _mask(tmp_path, _foreground_square(value, dtype=dtype), "two_values.png")
    np.testing.assert_array_equal(read_binary_mask(path), SQUARE)


def test_a_middle_value_covering_an_area_is_refused(tmp_path):
    array = _foreground_square(255)
    array[7:, :] = 128
    path = _mask(tmp_path, array, "three.png")
    with pytest.raises(ConversionError) as e:
        read_binary_mask(path)
    assert str(e.value) == (f"mask {path} holds the values {{0, 128, 255}}: 128 covers 30 % of the pixels, in the "
                            f"middle of its range (above 63.75, below 191.25), so it is neither faint background "
                            f"nor an anti-aliased edge (expected a binary mask: 0 and one foreground value)")


def test_a_jpeg_mask_that_would_come_out_empty_is_refused(tmp_path):
    path = _mask(tmp_path, _foreground_square(100), "faint.jpg", quality=100)
    with pytest.raises(ConversionError, match=r"faint.jpg would be written empty: its values reach 1\d\d \(\{.*\}\) "
                                              r"but none exceeds half its range \(127.5\)"):
        read_binary_mask(path)


def test_an_empty_mask_stays_empty(tmp_path):
    assert not read_binary_mask(_mask(tmp_path, np.zeros((10, 10), np.uint8), "empty.png")).any()
    assert not read_binary_mask(_mask(tmp_path, np.zeros((10, 10), np.uint8), "empty.jpg")).any()


# ------------------------------------------------------------------------------------------------
# the image rule (read_rgb)


def test_a_16_bit_image_is_scaled_by_its_real_range(tmp_path):
    from nnunetv2_meddisseg.datasets.image_io import read_rgb

    array = np.linspace(0, 65535, 100).reshape(10, 10).astype(np.uint16)
    out = np.asarray(read_rgb(_mask(tmp_path, array, "wide.png")))
    assert out.shape == (10, 10, 3) and out[..., 0].min() == 0 and out[..., 0].max() == 255
    np.testing.assert_allclose(out[..., 0], array / 65535 * 255, atol=0.51)


def test_8_bit_values_in_a_16_bit_file_are_kept(tmp_path):
    from nnunetv2_meddisseg.datasets.image_io import read_rgb

    array = np.arange(100, dtype=np.uint16).reshape(10, 10) + 20
    np.testing.assert_array_equal(np.asarray(read_rgb(_mask(tmp_path, array, "narrow.png")))[..., 1], array)


def test_a_float_image_is_scaled_by_its_real_range(tmp_path):
    from nnunetv2_meddisseg.datasets.image_io import read_rgb

    array = np.linspace(-1.0, 3.0, 100, dtype=np.float32).reshape(10, 10)
    out = np.asarray(read_rgb(_mask(tmp_path, array, "float.tif")))
    np.testing.assert_allclose(out[..., 2], (array + 1) / 4 * 255, atol=0.51)


def test_a_float_image_with_nan_is_refused(tmp_path):
    from nnunetv2_meddisseg.datasets.image_io import read_rgb

    array = np.ones((10, 10), np.float32)
    array[3, 3] = np.nan
    path = _mask(tmp_path, array, "nan.tif")
    with pytest.raises(ConversionError) as e:
        read_rgb(path)
    assert str(e.value) == (f"image {path} holds NaN or inf values: replace them (e.g. numpy.nan_to_num) and save it "
                            f"as an 8-bit or 16-bit PNG")


def test_a_foreground_that_vanishes_at_resize_is_refused(tmp_path):
    from nnunetv2_meddisseg.datasets.cases import SourceCase
    from nnunetv2_meddisseg.datasets.image_io import write_binary_2d_case

    mask = np.zeros((100, 100), np.uint8)
    mask[41, 43] = 255
    case = SourceCase("c", _mask(tmp_path, np.zeros((100, 100, 3), np.uint8), "image.png"),
                      _mask(tmp_path, mask, "dot.png"))
    with pytest.raises(ConversionError) as e:
        write_binary_2d_case(case, tmp_path / "out_0000.png", tmp_path / "out.png", resize=16)
    assert str(e.value) == (f"--resize 16: the foreground of mask {tmp_path / 'dot.png'} (1 pixels) vanishes at 16x16: "
                            f"choose a larger --resize")


@pytest.mark.parametrize("transparency", [None, 0])
def test_palette_files_convert_to_what_nnunet_reads_from_them(tmp_path, transparency):
    """A palette image becomes the RGB of its palette colours, which is what nnU-Net's reader (NaturalImage2DIO)
    makes of the palette file itself (with or without a transparent index); a palette mask of indices 0/1 becomes
    the label file nnU-Net reads as those labels."""
    from nnunetv2.imageio.natural_image_reader_writer import NaturalImage2DIO

    from nnunetv2_meddisseg.datasets.cases import SourceCase
    from nnunetv2_meddisseg.datasets.image_io import write_binary_2d_case

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 6, (12, 10), dtype=np.uint8), "P")
    image.putpalette(rng.integers(0, 256, 18, dtype=np.uint8).tolist() + [0] * 750)
    image.save(tmp_path / "image.png", **({} if transparency is None else {"transparency": transparency}))
    labels = (rng.random((12, 10)) < 0.4).astype(np.uint8)
    mask = Image.fromarray(labels, "P")
    mask.putpalette([255, 255, 255, 200, 0, 0] + [0] * 762)  # index 0 drawn white, index 1 dark red
    mask.save(tmp_path / "mask.png", **({} if transparency is None else {"transparency": transparency}))
    reader = NaturalImage2DIO()
    source, _ = reader.read_images([str(tmp_path / "image.png")])  # (C, 1, H, W)
    write_binary_2d_case(SourceCase("c", tmp_path / "image.png", tmp_path / "mask.png"), tmp_path / "c_0000.png",
                         tmp_path / "c.png", resize=None)
    written, _ = reader.read_images([str(tmp_path / "c_0000.png")])
    np.testing.assert_array_equal(written, source[:3])
    expected = np.asarray(image.convert("RGB")).transpose(2, 0, 1)[:, None]
    np.testing.assert_array_equal(written, expected)
    seg, _ = reader.read_seg(str(tmp_path / "c.png"))
    np.testing.assert_array_equal(seg, labels[None, None])
