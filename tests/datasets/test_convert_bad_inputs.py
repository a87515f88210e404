"""Bad sources and options: one row per case, each through the real command (``main``).

Every failing row must exit non-zero with exactly one line ``nnUNetv2_meddisseg_convert: error:
...`` naming the file or option, print no traceback, and leave no dataset (nor a ``.partial``
folder) behind.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk
from convert_trees import make_kvasir_tree, make_pairs, read_png, save, write_split
from PIL import Image
from planted import KINDS, plant, snapshot

from nnunetv2_meddisseg.datasets.convert import main
from nnunetv2_meddisseg.files import find_set_aside, set_aside

PREFIX = "nnUNetv2_meddisseg_convert: error: "
IDS = ["k0", "k1", "k2", "k3"]


def _kvasir(tmp: Path, **kwargs) -> tuple:
    src = make_kvasir_tree(tmp / "Kvasir-SEG", IDS, **kwargs)
    split = write_split(tmp / "split.json", ["k0", "k1"], ["k2"], ["k3"])
    return src, ["--split_file", str(split)]


def _btcv(tmp: Path, label_value: int = 3, cases=("case0005", "case0006", "case0001")) -> tuple:
    base = tmp / "RawData" / "Training"
    (base / "img").mkdir(parents=True)
    (base / "label").mkdir()
    for case_id in cases:
        n = case_id[4:]
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((2, 4, 4), np.int16)), str(base / "img" / f"img{n}.nii.gz"))
        label = np.zeros((2, 4, 4), np.uint8)
        label[0, 0, 0] = label_value if case_id == "case0006" else 1
        sitk.WriteImage(sitk.GetImageFromArray(label), str(base / "label" / f"label{n}.nii.gz"))
    split = write_split(tmp / "split.json", ["case0005"], ["case0006"], ["case0001"])
    return tmp, ["--split_file", str(split)]


# each builder returns (argv, substrings the message must contain, exit code)
def row_missing_source(tmp):
    return ["kvasir-seg", str(tmp / "nowhere"), "-d", "31"], ["nowhere", "does not exist"], 2


def row_image_without_mask(tmp):
    src, split = _kvasir(tmp)
    (src / "masks" / "k1.jpg").unlink()
    return ["kvasir-seg", str(src), "-d", "31", *split], ["images/k1.jpg", "has no mask", "masks/k1.jpg"], 2


def row_mask_without_image(tmp):
    src, split = _kvasir(tmp)
    (src / "images" / "k2.jpg").unlink()
    return ["kvasir-seg", str(src), "-d", "31", *split], ["masks/k2.jpg", "has no image"], 2


def row_size_mismatch(tmp):
    src, split = _kvasir(tmp)
    save(np.zeros((10, 12, 3), np.uint8), src / "masks" / "k1.jpg")
    return ["kvasir-seg", str(src), "-d", "31", *split], ["masks/k1.jpg", "12x10", "expected the same size"], 2


def row_corrupt_image(tmp):
    src, split = _kvasir(tmp)
    (src / "images" / "k3.jpg").write_bytes(b"this is not a JPEG file")
    return ["kvasir-seg", str(src), "-d", "31", *split], ["cannot read image", "images/k3.jpg"], 2


def row_truncated_image(tmp):
    """The header reads fine, decoding fails half-way through the writing: nothing may be left."""
    src, split = _kvasir(tmp, size=(200, 240))
    data = (src / "images" / "k2.jpg").read_bytes()
    (src / "images" / "k2.jpg").write_bytes(data[: len(data) // 2])
    return ["kvasir-seg", str(src), "-d", "31", *split], ["images/k2.jpg", "corrupt or truncated"], 2


def row_undeclared_label_btcv(tmp):
    src, split = _btcv(tmp, label_value=14)
    return ["synapse", str(src), "-d", "31", *split], ["label0006.nii.gz", "14", "BTCV labels"], 2


def row_undeclared_label_transunet(tmp):
    (tmp / "train_npz").mkdir()
    for case_id, value in (("case0005", 8), ("case0006", 9)):
        np.savez(tmp / "train_npz" / f"{case_id}_slice000.npz", image=np.zeros((3, 3), np.float32),
                 label=np.full((3, 3), value, np.float32))
    return ["synapse", str(tmp), "-d", "31"], ["case0006_slice*.npz", "9", "organ labels"], 2


def row_empty_source(tmp):
    (tmp / "Kvasir-SEG" / "images").mkdir(parents=True)
    (tmp / "Kvasir-SEG" / "masks").mkdir()
    return ["kvasir-seg", str(tmp / "Kvasir-SEG"), "-d", "31"], ["no images", "Kvasir-SEG/images"], 2


def row_empty_mask_folder(tmp):
    src, split = _kvasir(tmp)
    for p in (src / "masks").iterdir():
        p.unlink()
    return ["kvasir-seg", str(src), "-d", "31", *split], ["no masks", "Kvasir-SEG/masks"], 2


def row_empty_glas_folder(tmp):
    (tmp / "Warwick QU Dataset (Released 2016_07_08)").mkdir()
    return ["glas", str(tmp), "-d", "31"], ["no train_N.bmp", str(tmp)], 2


def row_resize_zero(tmp):
    src, split = _kvasir(tmp)
    return ["kvasir-seg", str(src), "-d", "31", "--resize", "0", *split], ["--resize", "positive", "0"], 2


def row_resize_negative(tmp):
    src, split = _kvasir(tmp)
    return ["kvasir-seg", str(src), "-d", "31", "--resize", "-5", *split], ["--resize", "-5"], 2


def row_dataset_id_out_of_range(tmp):
    src, split = _kvasir(tmp)
    return ["kvasir-seg", str(src), "-d", "1000", *split], ["-d", "1 and 999", "1000"], 2


def row_split_file_unknown_case(tmp):
    src, _ = _kvasir(tmp)
    split = write_split(tmp / "mine.json", ["k0", "zz9"], ["k1"], [])
    args = ["kvasir-seg", str(src), "-d", "31", "--split_file", str(split)]
    return args, ["mine.json", "zz9", "not in the source"], 2


def row_split_file_not_json(tmp):
    src, _ = _kvasir(tmp)
    (tmp / "mine.json").write_text("train: [k0]")
    return ["kvasir-seg", str(src), "-d", "31", "--split_file", str(tmp / "mine.json")], ["mine.json", "JSON"], 2


def row_split_file_overlap(tmp):
    src, _ = _kvasir(tmp)
    split = write_split(tmp / "mine.json", ["k0", "k1"], ["k1"], [])
    return ["kvasir-seg", str(src), "-d", "31", "--split_file", str(split)], ["mine.json", "k1", "'train' and 'val'"], 2


def row_shipped_split_mismatch(tmp):
    src, _ = _kvasir(tmp)
    return ["kvasir-seg", str(src), "-d", "31"], ["splits/kvasir_seg.json", "--split_file", "k0"], 2


def row_isic2017_truth_folder_missing(tmp):
    make_pairs(tmp / "ISIC-2017_Training_Data", tmp / "ISIC-2017_Training_Part1_GroundTruth", ["ISIC_0000001"],
               ".jpg", ".png", mask_tag="_segmentation")
    (tmp / "ISIC-2017_Test_v2_Data").mkdir()
    return ["isic2017", str(tmp), "-d", "31"], ["ISIC-2017_Test_v2_Part1_GroundTruth", "is missing"], 2


def row_isic2016_required_folder_missing(tmp):
    make_pairs(tmp / "ISBI2016_ISIC_Part1_Training_Data", tmp / "ISBI2016_ISIC_Part1_Training_GroundTruth",
               ["ISIC_0000001"], ".jpg", ".png", mask_tag="_Segmentation")
    return ["isic2016", str(tmp), "-d", "31"], ["ISBI2016_ISIC_Part1_Test_Data", "does not exist"], 2


def row_synapse_missing_transunet_case(tmp):
    src, _ = _btcv(tmp)
    return ["synapse", str(src), "-d", "31"], ["img0007.nii.gz", "case0007", "--split_file"], 2


def row_synapse_unknown_layout(tmp):
    (tmp / "volumes").mkdir()
    return ["synapse", str(tmp), "-d", "31"], ["RawData/Training/img", "train_npz"], 2


def row_h5_without_h5py(tmp):
    """(h5py is hidden from ``import`` for this row: see HIDDEN_MODULES)"""
    (tmp / "test_vol_h5").mkdir()
    (tmp / "test_vol_h5" / "case0001.npy.h5").write_bytes(b"\x89HDF")
    return ["synapse", str(tmp), "-d", "31"], ["test_vol_h5", "needs h5py", "pip install h5py"], 2


ROWS = [row_missing_source, row_image_without_mask, row_mask_without_image, row_size_mismatch, row_corrupt_image,
        row_truncated_image, row_undeclared_label_btcv, row_undeclared_label_transunet, row_empty_source,
        row_empty_mask_folder, row_empty_glas_folder, row_resize_zero, row_resize_negative,
        row_dataset_id_out_of_range, row_split_file_unknown_case, row_split_file_not_json, row_split_file_overlap,
        row_shipped_split_mismatch, row_isic2017_truth_folder_missing, row_isic2016_required_folder_missing,
        row_synapse_missing_transunet_case, row_synapse_unknown_layout, row_h5_without_h5py]


# rows that must run as if these modules were not installed
HIDDEN_MODULES = {row_h5_without_h5py: ["h5py"]}


def _left_behind(raw: Path) -> list:
    return sorted(p.name for p in raw.iterdir()) if raw.is_dir() else []


@pytest.mark.parametrize("row", ROWS, ids=[r.__name__[4:] for r in ROWS])
def test_bad_input_gives_one_line_error_and_leaves_nothing(row, tmp_path, nnunet_dirs, capsys, monkeypatch):
    for module in HIDDEN_MODULES.get(row, []):
        monkeypatch.setitem(sys.modules, module, None)  # ``import module`` now raises ImportError
    src_root = tmp_path / "src"
    src_root.mkdir()
    argv, expected, code = row(src_root)
    rc = main([*argv, "-np", "1"])
    err = capsys.readouterr().err
    assert rc == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), err
    for text in expected:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    assert "Traceback" not in err
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == []
    assert _left_behind(nnunet_dirs["nnUNet_preprocessed"]) == []


def test_truncated_image_fails_in_a_worker_process_too(tmp_path, nnunet_dirs, capsys):
    argv, expected, code = row_truncated_image(tmp_path)
    assert main([*argv, "-np", "2"]) == code
    err = capsys.readouterr().err
    assert err.startswith(PREFIX) and all(t in err for t in expected) and "Traceback" not in err
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == []


def test_missing_nnunet_raw_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("nnUNet_raw", raising=False)
    src, split = _kvasir(tmp_path)
    assert main(["kvasir-seg", str(src), "-d", "31", *split]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(PREFIX) and "nnUNet_raw" in err and len(err.splitlines()) == 1


def test_noisy_jpeg_mask_is_thresholded_not_rejected(tmp_path, nnunet_dirs):
    src, split = _kvasir(tmp_path)
    noisy = np.asarray(Image.open(src / "masks" / "k0.jpg").convert("L"))
    assert len(np.unique(noisy)) > 2  # JPEG really left grey values
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 0
    label = read_png(nnunet_dirs["nnUNet_raw"] / "Dataset031_KvasirSEG" / "labelsTr" / "k0.png")
    np.testing.assert_array_equal(label, (noisy > 127).astype(np.uint8))


def test_existing_dataset_is_refused_then_replaced_with_overwrite(tmp_path, nnunet_dirs, capsys):
    src, split = _kvasir(tmp_path)
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset031_KvasirSEG"
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 0
    capsys.readouterr()
    assert main(["kvasir-seg", str(src), "-d", "31", "--resize", "16", *split, "-np", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(PREFIX) and str(raw) in err and "--overwrite" in err and len(err.splitlines()) == 1
    assert read_png(raw / "labelsTr" / "k0.png").shape == (24, 20)  # untouched
    (nnunet_dirs["nnUNet_preprocessed"] / raw.name / "nnUNetPlans.json").write_text("{}")
    assert main(["kvasir-seg", str(src), "-d", "31", "--resize", "16", *split, "-np", "1", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "preprocessed data of an earlier conversion" in err
    assert read_png(raw / "labelsTr" / "k0.png").shape == (16, 16)
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == [raw.name]


def test_a_dataset_a_killed_conversion_set_aside_is_put_back(tmp_path, nnunet_dirs, capsys):
    src, split = _kvasir(tmp_path)
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset031_KvasirSEG"
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 0
    set_aside(raw)  # killed between replace_folder's two renames: only the old dataset, aside
    assert main(["kvasir-seg", str(src), "-d", "31", "--resize", "16", *split, "-np", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err  # the old dataset is back and guarded as before
    assert read_png(raw / "labelsTr" / "k0.png").shape == (24, 20) and find_set_aside(raw) is None
    holder = set_aside(raw)  # killed after the new dataset was in place, while the old one was removed
    shutil.copytree(holder / "kept", raw)
    assert main(["kvasir-seg", str(src), "-d", "31", "--resize", "16", *split, "-np", "1", "--overwrite"]) == 0
    assert read_png(raw / "labelsTr" / "k0.png").shape == (16, 16)
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == [raw.name]


def test_overwrite_replaces_a_changed_split_in_preprocessed(tmp_path, nnunet_dirs, capsys):
    src, split = _kvasir(tmp_path)
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 0
    prep = nnunet_dirs["nnUNet_preprocessed"] / "Dataset031_KvasirSEG" / "splits_final.json"
    other = write_split(tmp_path / "other.json", ["k0", "k2"], ["k1"], ["k3"])
    assert main(["kvasir-seg", str(src), "-d", "31", "--split_file", str(other), "-np", "1", "--overwrite"]) == 0
    assert json.loads(prep.read_text()) == [{"train": ["k0", "k2"], "val": ["k1"]}]


def test_differing_preprocessed_split_without_overwrite_is_refused(tmp_path, nnunet_dirs, capsys):
    src, split = _kvasir(tmp_path)
    prep = nnunet_dirs["nnUNet_preprocessed"] / "Dataset031_KvasirSEG"
    prep.mkdir()
    (prep / "splits_final.json").write_text(json.dumps([{"train": ["k1"], "val": ["k0"]}]))
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(PREFIX) and "splits_final.json" in err and "--overwrite" in err
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == []


def test_id_taken_by_another_dataset_name_is_refused(tmp_path, nnunet_dirs, capsys):
    (nnunet_dirs["nnUNet_raw"] / "Dataset031_Other").mkdir()
    src, split = _kvasir(tmp_path)
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(PREFIX) and "Dataset031_Other" in err
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == ["Dataset031_Other"]


def test_console_script_exit_code_and_stderr(tmp_path, nnunet_dirs):
    script = Path(sys.executable).parent / "nnUNetv2_meddisseg_convert"
    if not script.exists():
        pytest.fail(f"{script} is missing: install the package (pip install -e .)")
    proc = subprocess.run([str(script), "kvasir-seg", str(tmp_path / "nowhere"), "-d", "31", "--resize", "0"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "--resize" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_stale_preprocessed_split_is_refused_then_removed_with_overwrite(tmp_path, nnunet_dirs, capsys):
    """An all-test conversion has no fold 0: an old splits_final.json would silently be used."""
    make_pairs(tmp_path / "Original", tmp_path / "Ground Truth", ["1", "2"], ".png", ".png")
    prep = nnunet_dirs["nnUNet_preprocessed"] / "Dataset032_CVCClinicDB"
    prep.mkdir()
    (prep / "splits_final.json").write_text(json.dumps([{"train": ["1"], "val": ["2"]}]))
    assert main(["cvc-clinicdb", str(tmp_path), "-d", "32", "-np", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(PREFIX) and "splits_final.json" in err and "--overwrite" in err
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == []
    assert main(["cvc-clinicdb", str(tmp_path), "-d", "32", "-np", "1", "--overwrite"]) == 0
    assert "removed" in capsys.readouterr().err and not (prep / "splits_final.json").exists()


def test_without_nnunet_preprocessed_the_split_stays_in_the_raw_folder(tmp_path, nnunet_dirs, monkeypatch, capsys):
    monkeypatch.delenv("nnUNet_preprocessed")
    src, split = _kvasir(tmp_path)
    assert main(["kvasir-seg", str(src), "-d", "33", *split, "-np", "1"]) == 0
    assert "nnUNet_preprocessed is not set" in capsys.readouterr().err
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset033_KvasirSEG"
    assert json.loads((raw / "splits_final.json").read_text()) == [{"train": ["k0", "k1"], "val": ["k2"]}]
    assert _left_behind(nnunet_dirs["nnUNet_preprocessed"]) == []


@pytest.mark.parametrize("name", [".Dataset031_KvasirSEG.partial", ".Dataset031_KvasirSEG.old"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_or_link_of_a_fixed_temporary_name_is_left_alone(tmp_path, nnunet_dirs, capsys, name, kind):
    """A user's folder, or a link to a folder outside, where the conversion's temporary or set-aside folder would
    be: the dataset is written and replaced all the same, nothing through the link, and both stay as they were."""
    src, split = _kvasir(tmp_path)
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset031_KvasirSEG"
    plant(raw.with_name(name), kind, tmp_path / "outside")
    before = snapshot(tmp_path, leave_out=[raw, nnunet_dirs["nnUNet_preprocessed"] / raw.name])
    assert main(["kvasir-seg", str(src), "-d", "31", *split, "-np", "1"]) == 0
    assert main(["kvasir-seg", str(src), "-d", "31", "--resize", "16", *split, "-np", "1", "--overwrite"]) == 0
    assert read_png(raw / "labelsTr" / "k0.png").shape == (16, 16) and not raw.is_symlink()
    assert snapshot(tmp_path, leave_out=[raw, nnunet_dirs["nnUNet_preprocessed"] / raw.name]) == before
    assert _left_behind(nnunet_dirs["nnUNet_raw"]) == sorted([raw.name, name])  # no temporary left
