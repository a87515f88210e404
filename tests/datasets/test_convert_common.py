"""Converter helpers: mask binarisation, seeded splits, split files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from nnunetv2_meddisseg.datasets.errors import OptionError
from nnunetv2_meddisseg.datasets.image_io import read_binary_mask, read_instance_mask_as_binary
from nnunetv2_meddisseg.datasets.split_lists import holdout_count, make_seeded_split, read_split_file


def _mask(tmp_path, array, name, mode=None, **save_kwargs):
    path = tmp_path / name
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(path, **save_kwargs)
    return path


@pytest.mark.parametrize("name, array, mode, expected", [
    ("zero_one.png", np.array([[0, 1], [1, 0]], np.uint8), None, [[0, 1], [1, 0]]),
    ("zero_255.png", np.array([[0, 255], [255, 0]], np.uint8), None, [[0, 1], [1, 0]]),
    ("antialiased.png", np.array([[0, 127], [128, 255]], np.uint8), None, [[0, 0], [1, 1]]),
    ("sixteen_bit.png", np.array([[0, 32767], [32768, 65535]], np.uint16), None, [[0, 0], [1, 1]]),
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
    """A JPEG mask with only values 0 and 1 is noise around black, not a label map."""
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
