"""Every converter on a tiny generated source tree in its publisher's layout."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import SimpleITK as sitk
from convert_trees import case_ids, expected_binary, make_kvasir_tree, make_pairs, read_png, save, write_split
from PIL import Image

from nnunetv2_meddisseg.datasets.convert import main as _main
from nnunetv2_meddisseg.datasets.synapse import (
    BTCV_TO_TRANSUNET,
    TRANSUNET_TEST_CASES,
    TRANSUNET_TRAIN_CASES,
    resize_in_plane,
)


def main(argv) -> int:
    """The command in one process (tiny trees: starting worker processes costs more than the work)."""
    return _main([*argv, "-np", "1"] if "-np" not in argv else argv)


def _raw(dirs, name: str) -> Path:
    return dirs["nnUNet_raw"] / name


def _splits(dirs, name: str) -> list:
    raw = json.loads((_raw(dirs, name) / "splits_final.json").read_text())
    assert raw == json.loads((dirs["nnUNet_preprocessed"] / name / "splits_final.json").read_text())
    return raw


def _check_binary_pairs(raw: Path, pairs: dict, sub: dict, reference=expected_binary):
    for case_id, (image_file, mask_file) in pairs.items():
        s = sub[case_id]
        np.testing.assert_array_equal(read_png(raw / f"labels{s}" / f"{case_id}.png"), reference(mask_file))
        with Image.open(image_file) as src:
            np.testing.assert_array_equal(read_png(raw / f"images{s}" / f"{case_id}_0000.png"),
                                          np.asarray(src.convert("RGB")))


def test_kvasir_layout_with_split_file_and_resize(nnunet_dirs, tmp_path, capsys):
    """Rectangular RGB-JPEG masks are thresholded (not rejected) and resized nearest to 16x16."""
    src = make_kvasir_tree(tmp_path / "Kvasir-SEG", [f"k{i}" for i in range(5)], size=(30, 40))
    split = write_split(tmp_path / "s.json", ["k0", "k1"], ["k2"], ["k3"])
    assert main(["kvasir-seg", str(tmp_path), "-d", "11", "--resize", "16", "--split_file", str(split)]) == 0
    out = capsys.readouterr()
    assert "1 source cases are in none of the --split_file lists" in out.err
    raw = _raw(nnunet_dirs, "Dataset011_KvasirSEG")
    assert case_ids(raw / "imagesTr") == {"k0", "k1", "k2"} and case_ids(raw / "imagesTs") == {"k3"}
    assert _splits(nnunet_dirs, raw.name) == [{"train": ["k0", "k1"], "val": ["k2"]}]
    for case_id in ("k0", "k3"):
        sub = "Tr" if case_id == "k0" else "Ts"
        label = read_png(raw / f"labels{sub}" / f"{case_id}.png")
        full = expected_binary(src / "masks" / f"{case_id}.jpg")  # 30 rows x 40 columns
        # nearest neighbour: output pixel i samples source pixel floor((i + 0.5) * scale)
        rows, cols = ((np.arange(16) + 0.5) * 30 / 16).astype(int), ((np.arange(16) + 0.5) * 40 / 16).astype(int)
        np.testing.assert_array_equal(label, full[np.ix_(rows, cols)])
        assert read_png(raw / f"images{sub}" / f"{case_id}_0000.png").shape == (16, 16, 3)
    meta = json.loads((raw / "dataset.json").read_text())
    assert meta["numTraining"] == 3 and meta["meddisseg_conversion"]["resize"] == 16


def test_glas_layout_instances_become_binary(nnunet_dirs, tmp_path, capsys):
    folder = tmp_path / "Warwick QU Dataset (Released 2016_07_08)"
    pairs = {}
    for prefix, n in (("train", 4), ("testA", 2), ("testB", 1)):
        pairs.update(make_pairs(folder, folder, [f"{prefix}_{i}" for i in range(1, n + 1)], ".bmp", ".bmp",
                                mask_tag="_anno", instance=True, seed=len(pairs)))
    (folder / "Grade.csv").write_text("name,grade\ntrain_1,benign\n")
    assert main(["glas", str(tmp_path), "-d", "12"]) == 0
    err = capsys.readouterr().err
    assert "found 4 train images" in err and "the published set has 85" in err
    raw = _raw(nnunet_dirs, "Dataset012_GlaS")
    assert case_ids(raw / "imagesTs") == {"testA_1", "testA_2", "testB_1"}
    (split,) = _splits(nnunet_dirs, raw.name)
    assert len(split["val"]) == 1 and sorted(split["train"] + split["val"]) == [f"train_{i}" for i in range(1, 5)]
    sub = {c: "Tr" if c.startswith("train") else "Ts" for c in pairs}
    _check_binary_pairs(raw, pairs, sub, reference=lambda p: (np.asarray(Image.open(p)) > 0).astype(np.uint8))
    assert json.loads((raw / "dataset.json").read_text())["labels"] == {"background": 0, "gland": 1}


def _isic2016_tree(root: Path) -> dict:
    pairs = make_pairs(root / "ISBI2016_ISIC_Part1_Training_Data", root / "ISBI2016_ISIC_Part1_Training_GroundTruth",
                       [f"ISIC_000000{i}" for i in range(4)], ".jpg", ".png", mask_tag="_Segmentation")
    pairs.update(make_pairs(root / "ISBI2016_ISIC_Part1_Test_Data", root / "ISBI2016_ISIC_Part1_Test_GroundTruth",
                            ["ISIC_0000010", "ISIC_0000011"], ".jpg", ".png", mask_tag="_Segmentation", seed=1))
    return pairs


def test_isic2016_layout(nnunet_dirs, tmp_path):
    pairs = _isic2016_tree(tmp_path)
    assert main(["isic2016", str(tmp_path), "-d", "13", "--resize", "16"]) == 0
    raw = _raw(nnunet_dirs, "Dataset013_ISIC2016")
    assert case_ids(raw / "imagesTs") == {"ISIC_0000010", "ISIC_0000011"}
    (split,) = _splits(nnunet_dirs, raw.name)
    assert len(split["train"]) == 3 and len(split["val"]) == 1
    for case_id in pairs:
        sub = "Ts" if case_id in {"ISIC_0000010", "ISIC_0000011"} else "Tr"
        assert read_png(raw / f"labels{sub}" / f"{case_id}.png").shape == (16, 16)
        assert set(np.unique(read_png(raw / f"labels{sub}" / f"{case_id}.png"))) <= {0, 1}


def _isic2017_tree(root: Path, with_val: bool = True, with_test: bool = True) -> dict:
    tag = "_segmentation"
    pairs = make_pairs(root / "ISIC-2017_Training_Data", root / "ISIC-2017_Training_Part1_GroundTruth",
                       [f"ISIC_000000{i}" for i in range(5)], ".jpg", ".png", mask_tag=tag)
    for case_id in pairs:  # the training folder also ships superpixel maps and a metadata table
        save(np.zeros((20, 24, 3), np.uint8), root / "ISIC-2017_Training_Data" / f"{case_id}_superpixels.png")
    (root / "ISIC-2017_Training_Data" / "ISIC-2017_Training_Data_metadata.csv").write_text("image_id\n")
    if with_val:
        pairs.update(make_pairs(root / "ISIC-2017_Validation_Data", root / "ISIC-2017_Validation_Part1_GroundTruth",
                                ["ISIC_0000020", "ISIC_0000021"], ".jpg", ".png", mask_tag=tag, seed=2))
    if with_test:
        pairs.update(make_pairs(root / "ISIC-2017_Test_v2_Data", root / "ISIC-2017_Test_v2_Part1_GroundTruth",
                                ["ISIC_0000030"], ".jpg", ".png", mask_tag=tag, seed=3))
    return pairs


def test_isic2017_layout_official_split(nnunet_dirs, tmp_path):
    pairs = _isic2017_tree(tmp_path)
    assert main(["isic2017", str(tmp_path), "-d", "14"]) == 0
    raw = _raw(nnunet_dirs, "Dataset014_ISIC2017")
    assert _splits(nnunet_dirs, raw.name) == [{"train": [f"ISIC_000000{i}" for i in range(5)],
                                              "val": ["ISIC_0000020", "ISIC_0000021"]}]
    assert case_ids(raw / "imagesTs") == {"ISIC_0000030"}
    assert not any("superpixels" in p.name for p in (raw / "imagesTr").iterdir())
    sub = {c: "Ts" if c == "ISIC_0000030" else "Tr" for c in pairs}
    _check_binary_pairs(raw, pairs, sub)


def test_isic2017_without_optional_folders_says_what_was_used(nnunet_dirs, tmp_path, capsys):
    _isic2017_tree(tmp_path, with_val=False, with_test=False)
    assert main(["isic2017", str(tmp_path), "-d", "15"]) == 0
    err = capsys.readouterr().err
    assert "no ISIC-2017_Validation_Data" in err and "seeded 1 of the 5 training images" in err
    assert "no ISIC-2017_Test_v2_Data" in err
    raw = _raw(nnunet_dirs, "Dataset015_ISIC2017")
    (split,) = _splits(nnunet_dirs, raw.name)
    assert len(split["train"]) == 4 and len(split["val"]) == 1 and not list((raw / "imagesTs").iterdir())


@pytest.mark.parametrize("suffix", [".tif", ".png"])
def test_cvc_clinicdb_layout_is_all_test(nnunet_dirs, tmp_path, suffix):
    pairs = make_pairs(tmp_path / "Original", tmp_path / "Ground Truth", ["1", "2", "10"], suffix, suffix)
    assert main(["cvc-clinicdb", str(tmp_path), "-d", "16"]) == 0
    raw = _raw(nnunet_dirs, "Dataset016_CVCClinicDB")
    meta = json.loads((raw / "dataset.json").read_text())
    assert meta["numTraining"] == 0 and meta["numTest"] == 3
    assert not (raw / "splits_final.json").exists() and case_ids(raw / "imagesTs") == {"1", "2", "10"}
    _check_binary_pairs(raw, pairs, {c: "Ts" for c in pairs})


def test_cvc_clinicdb_split_file_makes_a_training_set(nnunet_dirs, tmp_path):
    make_pairs(tmp_path / "Original", tmp_path / "Ground Truth", ["1", "2", "3", "4"], ".tif", ".tif")
    split = write_split(tmp_path / "s.json", ["1", "2"], ["3"], ["4"])
    assert main(["cvc-clinicdb", str(tmp_path), "-d", "17", "--split_file", str(split)]) == 0
    raw = _raw(nnunet_dirs, "Dataset017_CVCClinicDB")
    assert _splits(nnunet_dirs, raw.name) == [{"train": ["1", "2"], "val": ["3"]}]


# ----------------------------------------------------------------------------------------------
# Synapse


def test_transunet_case_lists():
    """TransUNet's lists_Synapse: test_vol.txt names these 12; train.txt's slices come from the
    other 18 of the 30 labelled BTCV training volumes (1-10, 21-40)."""
    assert TRANSUNET_TEST_CASES == ("case0008", "case0022", "case0038", "case0036", "case0032", "case0002",
                                    "case0029", "case0003", "case0001", "case0004", "case0025", "case0035")
    btcv = {f"case{i:04d}" for i in list(range(1, 11)) + list(range(21, 41))}
    assert len(TRANSUNET_TRAIN_CASES) == 18 and set(TRANSUNET_TRAIN_CASES) == btcv - set(TRANSUNET_TEST_CASES)


def _volume(array: np.ndarray, spacing=(0.8, 0.7, 2.5), origin=(-10.0, 5.0, 30.0)) -> sitk.Image:
    img = sitk.GetImageFromArray(array)
    img.SetSpacing(spacing)
    img.SetOrigin(origin)
    return img


def make_btcv_tree(root: Path, cases=TRANSUNET_TRAIN_CASES + TRANSUNET_TEST_CASES, shape=(3, 6, 5)) -> Path:
    """``RawData/Training/img/imgNNNN.nii.gz`` + ``label/labelNNNN.nii.gz`` with labels 0..13."""
    rng = np.random.default_rng(0)
    base = root / "RawData" / "Training"
    for sub in ("img", "label"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for case_id in cases:
        n = case_id[4:]
        image = rng.integers(-1000, 1000, shape).astype(np.int16)
        label = rng.integers(0, 14, shape).astype(np.uint8)
        sitk.WriteImage(_volume(image), str(base / "img" / f"img{n}.nii.gz"))
        sitk.WriteImage(_volume(label), str(base / "label" / f"label{n}.nii.gz"))
    (root / "RawData" / "Testing" / "img").mkdir(parents=True)
    return root


def test_synapse_btcv_layout_maps_labels_and_keeps_geometry(nnunet_dirs, tmp_path):
    src = make_btcv_tree(tmp_path / "btcv")
    assert main(["synapse", str(src), "-d", "18", "-np", "2"]) == 0
    raw = _raw(nnunet_dirs, "Dataset018_Synapse")
    assert case_ids(raw / "imagesTs", ".nii.gz") == set(TRANSUNET_TEST_CASES)
    (split,) = _splits(nnunet_dirs, raw.name)
    assert len(split["train"]) == 16 and len(split["val"]) == 2
    assert sorted(split["train"] + split["val"]) == sorted(TRANSUNET_TRAIN_CASES)
    meta = json.loads((raw / "dataset.json").read_text())
    assert meta["channel_names"] == {"0": "CT"} and meta["file_ending"] == ".nii.gz"
    assert meta["labels"] == {"background": 0, "aorta": 1, "gallbladder": 2, "left kidney": 3, "right kidney": 4,
                              "liver": 5, "pancreas": 6, "spleen": 7, "stomach": 8}
    lut = np.zeros(14, np.uint8)
    for btcv, ours in {8: 1, 4: 2, 3: 3, 2: 4, 6: 5, 11: 6, 1: 7, 7: 8}.items():  # written out by hand
        lut[btcv] = ours
    assert BTCV_TO_TRANSUNET == {b: int(lut[b]) for b in range(14) if lut[b]}
    for case_id, sub in (("case0005", "Tr"), ("case0001", "Ts")):
        n = case_id[4:]
        src_label = sitk.ReadImage(str(src / "RawData" / "Training" / "label" / f"label{n}.nii.gz"))
        src_image = sitk.ReadImage(str(src / "RawData" / "Training" / "img" / f"img{n}.nii.gz"))
        label = sitk.ReadImage(str(raw / f"labels{sub}" / f"{case_id}.nii.gz"))
        image = sitk.ReadImage(str(raw / f"images{sub}" / f"{case_id}_0000.nii.gz"))
        np.testing.assert_array_equal(sitk.GetArrayFromImage(label), lut[sitk.GetArrayFromImage(src_label)])
        np.testing.assert_array_equal(sitk.GetArrayFromImage(image), sitk.GetArrayFromImage(src_image))
        for out in (image, label):
            assert out.GetSpacing() == pytest.approx(src_image.GetSpacing())
            assert out.GetOrigin() == pytest.approx(src_image.GetOrigin())


def test_synapse_dataset_passes_nnunet_check(nnunet_dirs, tmp_path):
    import multiprocessing.dummy

    from nnunetv2.experiment_planning import verify_dataset_integrity as vdi

    src = make_btcv_tree(tmp_path / "btcv")
    assert main(["synapse", str(src / "RawData"), "-d", "19", "--resize", "16"]) == 0
    raw = _raw(nnunet_dirs, "Dataset019_Synapse")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vdi, "multiprocessing", SimpleNamespace(get_context=lambda method: multiprocessing.dummy))
        vdi.verify_dataset_integrity(str(raw), num_processes=2)
    label = sitk.ReadImage(str(raw / "labelsTr" / "case0005.nii.gz"))
    assert label.GetSize() == (16, 16, 3)
    assert label.GetSpacing() == pytest.approx((0.8 * 5 / 16, 0.7 * 6 / 16, 2.5))  # (x, y, z); source 5 x 6 x 3


def test_resize_in_plane_keeps_extent_and_picks_nearest_labels():
    arr = np.arange(2 * 5 * 6, dtype=np.uint8).reshape(2, 5, 6)  # (z, y, x)
    img = _volume(arr, spacing=(1.5, 2.0, 3.0), origin=(10.0, 20.0, 30.0))
    out = resize_in_plane(img, 4, is_label=True)
    assert out.GetSize() == (4, 4, 2)
    assert out.GetSpacing() == pytest.approx((1.5 * 6 / 4, 2.0 * 5 / 4, 3.0))
    # the first pixel's centre moves by half the spacing change, so the outer edge stays put
    assert out.GetOrigin() == pytest.approx((10.0 + (2.25 - 1.5) / 2, 20.0 + (2.5 - 2.0) / 2, 30.0))
    # nearest neighbour: output pixel i sits at input index (i + 0.5) * scale - 0.5 (no ties here)
    xs = np.floor((np.arange(4) + 0.5) * 6 / 4).astype(int)
    ys = np.floor((np.arange(4) + 0.5) * 5 / 4).astype(int)
    np.testing.assert_array_equal(sitk.GetArrayFromImage(out), arr[:, ys][:, :, xs])
    linear = resize_in_plane(sitk.Cast(img, sitk.sitkFloat32), 4, is_label=False)
    assert sitk.GetArrayFromImage(linear).min() >= arr.min() and sitk.GetArrayFromImage(linear).max() <= arr.max()


def _npz_tree(root: Path, cases=("case0005", "case0006", "case0007"), slices=3, shape=(5, 4)) -> Path:
    rng = np.random.default_rng(1)
    (root / "train_npz").mkdir(parents=True)
    for case_id in cases:
        for s in reversed(range(slices)):  # written out of order on purpose
            image = np.full(shape, s / 10, np.float32) + rng.uniform(0, 0.01, shape).astype(np.float32)
            label = rng.integers(0, 9, shape).astype(np.float32)
            np.savez(root / "train_npz" / f"{case_id}_slice{s:03d}.npz", image=image, label=label)
    return root


def test_synapse_transunet_npz_layout_stacks_slices_in_order(nnunet_dirs, tmp_path, capsys):
    src = _npz_tree(tmp_path / "Synapse")
    assert main(["synapse", str(tmp_path), "-d", "20"]) == 0
    assert "no test set written" in capsys.readouterr().err
    raw = _raw(nnunet_dirs, "Dataset020_Synapse")
    (split,) = _splits(nnunet_dirs, raw.name)
    assert sorted(split["train"] + split["val"]) == ["case0005", "case0006", "case0007"]
    image = sitk.GetArrayFromImage(sitk.ReadImage(str(raw / "imagesTr" / "case0006_0000.nii.gz")))
    label = sitk.GetArrayFromImage(sitk.ReadImage(str(raw / "labelsTr" / "case0006.nii.gz")))
    assert image.shape == (3, 5, 4)
    np.testing.assert_allclose(image.mean(axis=(1, 2)), [0.005, 0.105, 0.205], atol=0.006)
    for s in range(3):
        with np.load(src / "train_npz" / f"case0006_slice{s:03d}.npz") as data:
            np.testing.assert_array_equal(label[s], data["label"].astype(np.uint8))


def test_synapse_transunet_h5_layout(nnunet_dirs, tmp_path):
    h5py = pytest.importorskip("h5py")
    src = _npz_tree(tmp_path / "Synapse", cases=("case0005",))
    (src / "test_vol_h5").mkdir()
    rng = np.random.default_rng(2)
    image, label = rng.uniform(0, 1, (4, 5, 6)).astype(np.float32), rng.integers(0, 9, (4, 5, 6)).astype(np.float32)
    with h5py.File(src / "test_vol_h5" / "case0001.npy.h5", "w") as f:
        f.create_dataset("image", data=image)
        f.create_dataset("label", data=label)
    assert main(["synapse", str(src), "-d", "21"]) == 0
    raw = _raw(nnunet_dirs, "Dataset021_Synapse")
    out = sitk.GetArrayFromImage(sitk.ReadImage(str(raw / "labelsTs" / "case0001.nii.gz")))
    np.testing.assert_array_equal(out, label.astype(np.uint8))
