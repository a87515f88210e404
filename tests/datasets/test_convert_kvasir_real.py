"""Kvasir-SEG and Kvasir-Sessile converted from the real data in ``$NNUNETV2_MEDDISSEG_TEST_DATA``
(skipped without it; see ``tests/real_data.py``).

Each full conversion (--resize 64) runs once per module and is checked by several tests.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from convert_trees import case_ids, expected_binary, read_png, write_split
from PIL import Image
from real_data import real_dataset
from scratch import scratch_folder

from nnunetv2_meddisseg.datasets.convert import main
from nnunetv2_meddisseg.datasets.split_lists import SPLIT_SEED, load_shipped_split, make_seeded_split

pytestmark = pytest.mark.real_data

KVASIR_SEG = "Kvasir-SEG"
KVASIR_SESSILE = "Kvasir-Sessile"


def _convert(request, tmp_path_factory, dataset: str, source: Path, dataset_id: int, extra=()) -> dict:
    root = scratch_folder(request, tmp_path_factory, dataset)
    env = {n: root / n for n in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}
    with pytest.MonkeyPatch.context() as mp:
        for name, path in env.items():
            path.mkdir()
            mp.setenv(name, str(path))
        rc = main([dataset, str(source), "-d", str(dataset_id), "--resize", "64", "-np", "2", *extra])
    assert rc == 0
    return env


@pytest.fixture(scope="module")
def kvasir_seg(request, tmp_path_factory):
    env = _convert(request, tmp_path_factory, "kvasir-seg", real_dataset(KVASIR_SEG), 601)
    return env, env["nnUNet_raw"] / "Dataset601_KvasirSEG"


@pytest.fixture(scope="module")
def kvasir_sessile(request, tmp_path_factory):
    env = _convert(request, tmp_path_factory, "kvasir-sessile", real_dataset(KVASIR_SESSILE), 602)
    return env, env["nnUNet_raw"] / "Dataset602_KvasirSessile"


@pytest.mark.parametrize("filename, folder, n_val, n_test", [
    ("kvasir_seg.json", KVASIR_SEG, 88, 120),
    ("kvasir_sessile.json", KVASIR_SESSILE, 20, 20),
])
def test_shipped_split_is_the_seeded_draw_from_the_real_file_names(filename, folder, n_val, n_test):
    ids = sorted(p.stem for p in (real_dataset(folder) / "images").glob("*.jpg"))
    shipped = load_shipped_split(filename)
    train, val, test = make_seeded_split(ids, n_val, n_test, SPLIT_SEED)
    assert (shipped["train"], shipped["val"], shipped["test"]) == (train, val, test)
    assert len(set(train) | set(val) | set(test)) == len(ids)


def _check_dataset(env, raw: Path, n_train: int, n_val: int, n_test: int, shipped: str):
    assert case_ids(raw / "imagesTr") == case_ids(raw / "labelsTr", channel=None)
    assert case_ids(raw / "imagesTs") == case_ids(raw / "labelsTs", channel=None)
    assert len(case_ids(raw / "imagesTr")) == n_train + n_val
    assert len(case_ids(raw / "imagesTs")) == n_test
    meta = json.loads((raw / "dataset.json").read_text())
    assert meta["numTraining"] == n_train + n_val
    assert meta["channel_names"] == {"0": "R", "1": "G", "2": "B"}
    assert meta["labels"] == {"background": 0, "polyp": 1}
    assert meta["file_ending"] == ".png"

    splits = json.loads((env["nnUNet_preprocessed"] / raw.name / "splits_final.json").read_text())
    assert splits == json.loads((raw / "splits_final.json").read_text())
    assert len(splits) == 1 and len(splits[0]["train"]) == n_train and len(splits[0]["val"]) == n_val
    assert set(splits[0]["train"]) | set(splits[0]["val"]) == case_ids(raw / "imagesTr")
    lists = load_shipped_split(shipped)
    assert (splits[0]["train"], splits[0]["val"]) == (lists["train"], lists["val"])
    assert case_ids(raw / "imagesTs") == set(lists["test"])


def _check_pixels(raw: Path):
    for sub in ("Tr", "Ts"):
        for label_file in sorted((raw / f"labels{sub}").glob("*.png")):
            with Image.open(label_file) as lbl:
                assert lbl.mode == "L" and lbl.size == (64, 64)
                values = np.unique(np.asarray(lbl))
            assert set(values.tolist()) <= {0, 1}, label_file
            assert 1 in values, f"{label_file}: every Kvasir image shows a polyp"
            with Image.open(raw / f"images{sub}" / label_file.name.replace(".png", "_0000.png")) as img:
                assert img.mode == "RGB" and img.size == (64, 64)


def test_kvasir_seg_counts_and_split(kvasir_seg):
    env, raw = kvasir_seg
    _check_dataset(env, raw, 792, 88, 120, "kvasir_seg.json")


def test_kvasir_seg_pixels(kvasir_seg):
    _check_pixels(kvasir_seg[1])


def test_kvasir_sessile_counts_and_split(kvasir_sessile):
    env, raw = kvasir_sessile
    _check_dataset(env, raw, 156, 20, 20, "kvasir_sessile.json")


def test_kvasir_sessile_pixels(kvasir_sessile):
    _check_pixels(kvasir_sessile[1])


@pytest.mark.parametrize("which", ["kvasir_seg", "kvasir_sessile"])
def test_nnunet_accepts_the_converted_dataset(which, request):
    """nnU-Net's own ID lookup and its full dataset check (run with a thread pool: spawning worker
    processes that import nnU-Net would cost more than the check itself)."""
    import multiprocessing.dummy

    from nnunetv2.experiment_planning import verify_dataset_integrity as vdi
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    env, raw = request.getfixturevalue(which)
    with pytest.MonkeyPatch.context() as mp:
        for name, path in env.items():
            mp.setenv(name, str(path))
        mp.setattr(vdi, "multiprocessing", SimpleNamespace(get_context=lambda method: multiprocessing.dummy))
        assert maybe_convert_to_dataset_name(int(raw.name[7:10])) == raw.name
        vdi.verify_dataset_integrity(str(raw), num_processes=2)  # raises on any problem


def test_full_resolution_masks_match_an_independent_threshold(tmp_path):
    """A few real cases without --resize (chosen with --split_file): labels equal the source mask's
    ITU-R 601 grey value > 127 and the images are the decoded JPEG pixels."""
    source = real_dataset(KVASIR_SEG)
    lists = load_shipped_split("kvasir_seg.json")
    train, val, test = lists["train"][:2], lists["val"][:1], lists["test"][:1]
    split = write_split(tmp_path / "split.json", train, val, test)
    with pytest.MonkeyPatch.context() as mp:
        for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
            mp.setenv(name, str(tmp_path / name))
        assert main(["kvasir-seg", str(source), "-d", "603", "--split_file", str(split), "-np", "1"]) == 0
    raw = tmp_path / "nnUNet_raw" / "Dataset603_KvasirSEG"
    for case_id, sub in [(c, "Tr") for c in train + val] + [(c, "Ts") for c in test]:
        label = read_png(raw / f"labels{sub}" / f"{case_id}.png")
        np.testing.assert_array_equal(label, expected_binary(source / "masks" / f"{case_id}.jpg"))
        with Image.open(source / "images" / f"{case_id}.jpg") as src:
            np.testing.assert_array_equal(read_png(raw / f"images{sub}" / f"{case_id}_0000.png"),
                                          np.asarray(src.convert("RGB")))
    assert json.loads((raw / "splits_final.json").read_text()) == [{"train": sorted(train), "val": sorted(val)}]
