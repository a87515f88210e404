"""The converter's rows of the bad-input table (harness and contract in tests/bad_input_table.py): Kvasir-SEG
layout (images/*.jpg + masks/*.jpg, 24x20 RGB; BTCV NIfTI for labels) through ``nnUNetv2_meddisseg_convert``'s
``main``; and a write that fails half-way (a simulated full disk)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import numpy as np
import pytest
import SimpleITK as sitk
from bad_input_table import Row, check_row, run_entry_point, tree
from convert_trees import expected_binary, make_kvasir_tree, read_png, save, write_split
from PIL import Image

from nnunetv2_meddisseg.datasets.convert import main as convert_main

KVASIR_IDS = ["k0", "k1", "k2", "k3"]
KVASIR_DATASET = "Dataset031_KvasirSEG"


def _kvasir(tmp: Path) -> List[str]:
    src = make_kvasir_tree(tmp / "Kvasir-SEG", KVASIR_IDS)
    split = write_split(tmp / "split.json", ["k0", "k1"], ["k2"], ["k3"])
    return ["kvasir-seg", str(src), "-d", "31", "--split_file", str(split), "-np", "1"]


def conv_source_missing(tmp, env):
    return ["kvasir-seg", str(tmp / "nowhere"), "-d", "31", "-np", "1"]


def conv_image_without_mask(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "masks" / "k1.jpg").unlink()
    return argv


def conv_mask_without_image(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "images" / "k2.jpg").unlink()
    return argv


def conv_size_mismatch(tmp, env):
    argv = _kvasir(tmp)
    save(np.zeros((10, 12, 3), np.uint8), tmp / "Kvasir-SEG" / "masks" / "k1.jpg")
    return argv


def conv_corrupt_image(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "images" / "k3.jpg").write_bytes(b"this is not a JPEG file")
    return argv


def conv_empty_source(tmp, env):
    (tmp / "Kvasir-SEG" / "images").mkdir(parents=True)
    (tmp / "Kvasir-SEG" / "masks").mkdir()
    return ["kvasir-seg", str(tmp / "Kvasir-SEG"), "-d", "31", "-np", "1"]


def conv_undeclared_label(tmp, env):
    """BTCV layout; case0006's label holds 14, which is none of the 13 organs."""
    base = tmp / "RawData" / "Training"
    (base / "img").mkdir(parents=True)
    (base / "label").mkdir()
    for n, value in (("0005", 1), ("0006", 14), ("0001", 1)):
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((2, 4, 4), np.int16)), str(base / "img" / f"img{n}.nii.gz"))
        label = np.zeros((2, 4, 4), np.uint8)
        label[0, 0, 0] = value
        sitk.WriteImage(sitk.GetImageFromArray(label), str(base / "label" / f"label{n}.nii.gz"))
    split = write_split(tmp / "split.json", ["case0005"], ["case0006"], ["case0001"])
    return ["synapse", str(tmp), "-d", "31", "--split_file", str(split), "-np", "1"]


def conv_dataset_exists(tmp, env):
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    return [*argv, "--resize", "16"]


def conv_resize_zero(tmp, env):
    return [*_kvasir(tmp), "--resize", "0"]


def conv_resize_one(tmp, env):
    return [*_kvasir(tmp), "--resize", "1"]


def conv_blue_masks(tmp, env):
    """Masks drawn in pure blue (grey value 29 by the usual conversion)."""
    argv = _kvasir(tmp)
    for case in KVASIR_IDS:
        path = tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"
        mask = np.asarray(Image.open(path)).copy()
        mask[..., :2] = 0
        save(mask, path, quality=100)
    return argv


def check_blue_masks_kept(tmp, env):
    labels = env["nnUNet_raw"] / KVASIR_DATASET / "labelsTr"
    for case in ("k0", "k1", "k2"):
        label = read_png(labels / f"{case}.png")
        assert label.any()
        np.testing.assert_array_equal(label, expected_binary(tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"))


def conv_faint_mask(tmp, env):
    """k2's mask drawn at grey 100: below the JPEG threshold, it would come out empty."""
    argv = _kvasir(tmp)
    path = tmp / "Kvasir-SEG" / "masks" / "k2.jpg"
    mask = np.asarray(Image.open(path).convert("L"))
    save(np.where(mask > 127, 100, 0).astype(np.uint8), path, quality=100)
    return argv


def conv_faint_jpeg_mask_40(tmp, env):
    """k1's mask drawn at grey 40 (all its values in the faint band): read by the bands it would be empty."""
    argv = _kvasir(tmp)
    path = tmp / "Kvasir-SEG" / "masks" / "k1.jpg"
    mask = np.asarray(Image.open(path).convert("L"))
    save(np.where(mask > 127, 40, 0).astype(np.uint8), path, quality=90)
    return argv


def _cvc(tmp: Path, masks: dict) -> List[str]:
    """CVC-ClinicDB's PNG layout, cases 1..4 with 0 / 255 masks except those in ``masks`` (case -> array)."""
    rng = np.random.default_rng(0)
    for case in ("1", "2", "3", "4"):
        save(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8), tmp / "cvc" / "Original" / f"{case}.png")
        mask = np.zeros((20, 24), np.uint8)
        mask[4:12, 6:18] = 255
        save(masks.get(case, mask), tmp / "cvc" / "Ground Truth" / f"{case}.png")
    return ["cvc-clinicdb", str(tmp / "cvc"), "-d", "32", "-np", "1"]


def _label_map_012() -> np.ndarray:
    mask = np.zeros((20, 24), np.uint8)
    mask[2:8, 4:20], mask[10:16, 4:20] = 1, 2
    return mask


def conv_label_map_mask(tmp, env):
    return _cvc(tmp, {"2": _label_map_012()})


def conv_label_map_mask_with_threshold(tmp, env):
    return [*_cvc(tmp, {"2": _label_map_012()}), "--mask_threshold", "0"]


def conv_colour_label_map_mask(tmp, env):
    labels = _label_map_012()
    return _cvc(tmp, {"3": np.stack([labels == 1, labels == 2, labels < 0], axis=-1).astype(np.uint8) * 255})


def conv_mask_threshold_above_label_range(tmp, env):
    """Every mask a plain 0 / 255 label: 300 is beyond their range all the same."""
    return [*_cvc(tmp, {}), "--mask_threshold", "300"]


def conv_png_image_without_mask(tmp, env):
    """CVC-ClinicDB takes TIFF, PNG and BMP: the message names the ending of the image it could not pair."""
    argv = _cvc(tmp, {})
    (tmp / "cvc" / "Ground Truth" / "3.png").unlink()
    return argv


def conv_png_mask_without_image(tmp, env):
    argv = _cvc(tmp, {})
    (tmp / "cvc" / "Original" / "4.png").unlink()
    return argv


def conv_source_is_the_dataset(tmp, env):
    """--overwrite with the dataset of this ID as the source: it would replace its own input."""
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    target = env["nnUNet_raw"] / KVASIR_DATASET
    (target / "Kvasir-SEG").mkdir()
    for sub in ("images", "masks"):
        (tmp / "Kvasir-SEG" / sub).rename(target / "Kvasir-SEG" / sub)
    return ["kvasir-seg", str(target / "Kvasir-SEG"), "-d", "31", "--split_file", argv[5], "-np", "1", "--overwrite"]


def conv_overwrite_replaces(tmp, env):
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    return [*argv, "--resize", "16", "--overwrite"]


def check_overwrite_replaced(tmp, env):
    labels = env["nnUNet_raw"] / KVASIR_DATASET / "labelsTr"
    assert read_png(labels / "k0.png").shape == (16, 16)
    assert sorted(p.name for p in env["nnUNet_raw"].iterdir()) == [KVASIR_DATASET]


def conv_noisy_jpeg_mask(tmp, env):
    argv = _kvasir(tmp)
    grey = np.asarray(Image.open(tmp / "Kvasir-SEG" / "masks" / "k0.jpg").convert("L"))
    assert len(np.unique(grey)) > 2  # JPEG really left grey values between 0 and 255
    return argv


def check_noisy_mask_thresholded(tmp, env):
    raw = env["nnUNet_raw"] / KVASIR_DATASET
    for folder, ids in (("labelsTr", ["k0", "k1", "k2"]), ("labelsTs", ["k3"])):
        for case in ids:
            label = read_png(raw / folder / f"{case}.png")
            assert set(np.unique(label).tolist()) <= {0, 1}
            np.testing.assert_array_equal(label, expected_binary(tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"))
    assert json.loads((raw / "dataset.json").read_text())["labels"] == {"background": 0, "polyp": 1}


def conv_jpeg_0_1_masks(tmp, env):
    """Every mask saved as a grey JPEG of a 0/1 label (the 0/1 masks kept beside, outside the source)."""
    argv = _kvasir(tmp)
    (tmp / "intended").mkdir()
    for case in KVASIR_IDS:
        path = tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"
        mask = (np.asarray(Image.open(path).convert("L")) > 127).astype(np.uint8)
        np.save(tmp / "intended" / f"{case}.npy", mask)
        save(mask, path, quality=95)
    return argv


def check_jpeg_0_1_masks(tmp, env):
    raw = env["nnUNet_raw"] / KVASIR_DATASET
    for folder, ids in (("labelsTr", ["k0", "k1", "k2"]), ("labelsTs", ["k3"])):
        for case in ids:
            label, intended = read_png(raw / folder / f"{case}.png"), np.load(tmp / "intended" / f"{case}.npy")
            assert intended.any() and set(np.unique(label).tolist()) <= {0, 1}
            dice = 2 * np.sum(label & intended) / (label.sum() + intended.sum())
            assert np.mean(label != intended) <= 0.05 and dice >= 0.9, case  # JPEG's edge noise, not an empty label


def _jpeg_label_map(tmp: Path, values) -> List[str]:
    """k1's mask a grey JPEG label map: background 0, a band of ``values[0]`` and a rectangle of ``values[1]``."""
    argv = _kvasir(tmp)
    mask = np.zeros((24, 20), np.uint8)
    mask[1:6, 2:18], mask[10:20, 4:16] = values
    save(mask, tmp / "Kvasir-SEG" / "masks" / "k1.jpg", quality=90)
    return argv


def conv_jpeg_label_map_0_100_200(tmp, env):
    return _jpeg_label_map(tmp, (100, 200))


def conv_jpeg_label_map_0_128_255(tmp, env):
    return _jpeg_label_map(tmp, (128, 255))



ROWS = [
    Row("convert/source_missing", "convert", conv_source_missing, 2, ["nowhere", "does not exist"]),
    Row("convert/image_without_mask", "convert", conv_image_without_mask, 2,
        ["images/k1.jpg", "has no mask", "masks/k1.jpg"]),
    Row("convert/mask_without_image", "convert", conv_mask_without_image, 2, ["masks/k2.jpg", "has no image"]),
    Row("convert/png_image_without_mask", "convert", conv_png_image_without_mask, 2,
        ["image ", "Original/3.png has no mask (expected ", "Ground Truth/3.png, or 3.tif/.tiff/.bmp)"]),
    Row("convert/png_mask_without_image", "convert", conv_png_mask_without_image, 2,
        ["mask ", "Ground Truth/4.png has no image (expected ", "Original/4.png, or 4.tif/.tiff/.bmp)"]),
    Row("convert/size_mismatch", "convert", conv_size_mismatch, 2, ["masks/k1.jpg", "12x10", "expected the same size"]),
    Row("convert/corrupt_image", "convert", conv_corrupt_image, 2, ["cannot read image", "images/k3.jpg"]),
    Row("convert/empty_source", "convert", conv_empty_source, 2, ["no images", "Kvasir-SEG/images"]),
    Row("convert/undeclared_label", "convert", conv_undeclared_label, 2, ["label0006.nii.gz", "14"]),
    Row("convert/dataset_exists", "convert", conv_dataset_exists, 2, [KVASIR_DATASET, "already exists", "--overwrite"]),
    Row("convert/resize_zero", "convert", conv_resize_zero, 2, ["--resize", "0", "positive"]),
    Row("convert/resize_one", "convert", conv_resize_one, 2, ["--resize must be at least 16 pixels", "got 1"]),
    Row("convert/blue_masks_kept", "convert", conv_blue_masks, 0, check=check_blue_masks_kept),
    Row("convert/faint_mask_would_be_empty", "convert", conv_faint_mask, 2,
        ["mask ", "masks/k2.jpg would be written empty: its values reach", "but none exceeds half its range (127.5)"]),
    Row("convert/faint_jpeg_mask_40", "convert", conv_faint_jpeg_mask_40, 2,
        ["masks/k1.jpg would be written empty: its values reach ", "but none exceeds half its range (127.5)"]),
    Row("convert/label_map_mask", "convert", conv_label_map_mask, 2,
        ["Ground Truth/2.png holds the values {0, 1, 2}: ", "a label map of 3 classes (a binary dataset has 2",
         "save them as binary masks (0 and one foreground value), or pass --skip_ambiguous"]),
    Row("convert/label_map_mask_with_threshold", "convert", conv_label_map_mask_with_threshold, 2,
        ["Ground Truth/2.png holds the values {0, 1, 2}: ", "a label map of 3 classes"]),
    Row("convert/colour_label_map_mask", "convert", conv_colour_label_map_mask, 2,
        ["Ground Truth/3.png holds 2 colours of different hues", "(255, 0, 0)", "(0, 255, 0)",
         "a label map of 3 classes"]),
    Row("convert/mask_threshold_above_label_range", "convert", conv_mask_threshold_above_label_range, 2,
        ["--mask_threshold 300 is not below the range of mask ", "Ground Truth/1.png (0..255)"]),
    Row("convert/source_inside_the_dataset", "convert", conv_source_is_the_dataset, 2,
        [f"{KVASIR_DATASET}/Kvasir-SEG is inside ", "the dataset this conversion writes (and --overwrite replaces)"]),
    Row("convert/overwrite_replaces", "convert", conv_overwrite_replaces, 0, check=check_overwrite_replaced),
    Row("convert/noisy_jpeg_mask_thresholded", "convert", conv_noisy_jpeg_mask, 0, check=check_noisy_mask_thresholded),
    Row("convert/jpeg_0_1_masks", "convert", conv_jpeg_0_1_masks, 0, check=check_jpeg_0_1_masks),
    Row("convert/jpeg_label_map_0_100_200", "convert", conv_jpeg_label_map_0_100_200, 2,
        ["1 of 4 masks are refused", "masks/k1.jpg holds the levels {0 (", "in the middle of its range",
         "--mask_threshold T"]),
    Row("convert/jpeg_label_map_0_128_255", "convert", conv_jpeg_label_map_0_128_255, 2,
        ["1 of 4 masks are refused", "masks/k1.jpg holds the levels {0 (", "in the middle of its range",
         "--mask_threshold T"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)


def test_convert_write_failure_leaves_nothing_and_names_the_path(tmp_path, nnunet_dirs, capsys, monkeypatch):
    """A full disk while a case is written: one line naming the file and the OS error, no partial folder."""
    import errno

    import nnunetv2_meddisseg.datasets.image_io as image_io

    work = tmp_path / "work"
    argv = _kvasir(work)
    real_save = Image.Image.save

    def disk_full(self, fp, *args, **kwargs):
        if str(fp).endswith("k2.png"):
            raise OSError(errno.ENOSPC, "No space left on device", str(fp))
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(image_io.Image.Image, "save", disk_full)
    before = tree(tmp_path)
    assert run_entry_point("convert", argv) == 2
    err = capsys.readouterr().err.strip()
    partial = re.escape(f"{nnunet_dirs['nnUNet_raw']}/.{KVASIR_DATASET}.") + r"\w{8}\.partial/"
    assert re.match(f"nnUNetv2_meddisseg_convert: error: cannot write {partial}", err), err
    assert err.endswith("labelsTr/k2.png: No space left on device") and err.count("\n") == 0
    assert tree(tmp_path) == before

