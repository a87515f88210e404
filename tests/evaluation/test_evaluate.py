import json
import os
import subprocess
import sys

import numpy as np
import pytest
import SimpleITK as sitk
from PIL import Image

from nnunetv2_meddisseg.evaluation.evaluate import (
    evaluate_folders,
    format_summary,
    load_dataset_json_labels,
    main,
    match_cases,
    read_label_map,
)


def write_png(path, arr):
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(path)


@pytest.fixture
def hand_folders(tmp_path):
    """Three 4x4 cases with hand-computed scores."""
    ref, pred = tmp_path / "ref", tmp_path / "pred"
    ref.mkdir()
    pred.mkdir()
    g = np.zeros((4, 4))
    g[0] = 1
    p = np.zeros((4, 4))
    p[0, :2] = 1
    p[1, :2] = 1
    write_png(ref / "a.png", g)      # I=2 |P|=4 |G|=4 U=6
    write_png(pred / "a.png", p)
    write_png(ref / "b.png", np.zeros((4, 4)))  # empty on empty
    write_png(pred / "b.png", np.zeros((4, 4)))
    write_png(ref / "c.png", g)      # missed lesion
    write_png(pred / "c.png", np.zeros((4, 4)))
    return ref, pred


def test_hand_computed_folder(hand_folders, tmp_path, capsys):
    ref, pred = hand_folders
    out = tmp_path / "summary.json"
    assert main(["-ref", str(ref), "-pred", str(pred), "-o", str(out)]) == 0
    s = json.loads(out.read_text())
    assert set(s) >= {"metric_per_case", "mean"}
    assert [c["case"] for c in s["metric_per_case"]] == ["a", "b", "c"]
    assert set(s["metric_per_case"][0]) == {"case", "iou", "dice", "recall", "precision"}
    a = s["metric_per_case"][0]
    assert (a["iou"], a["dice"], a["recall"], a["precision"]) == pytest.approx((1 / 3, 0.5, 0.5, 0.5))
    assert s["metric_per_case"][1] == {"case": "b", "iou": 1.0, "dice": 1.0, "recall": 1.0, "precision": 1.0}
    assert s["mean"] == pytest.approx({"iou": 4 / 9, "dice": 0.5, "recall": 0.5, "precision": 5 / 6})
    assert s["std"]["iou"] == pytest.approx(np.sqrt(21) / 9)
    printed = capsys.readouterr().out
    assert "mIoU        44.4 +- 50.9 %" in printed
    assert "mDSC        50.0 +- 50.0 %" in printed
    assert "Precision   83.3" in printed


class _SerialPool:
    """Stands in for nnU-Net's spawn pool: same function, same arguments, run in this process (saves ~9 s)."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def starmap(self, fn, iterable):
        return [fn(*args) for args in iterable]


class _SerialContext:
    Pool = _SerialPool


def test_dice_matches_nnunet_evaluator(tmp_path, monkeypatch):
    from nnunetv2.evaluation import evaluate_predictions
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics_on_folder
    monkeypatch.setattr(evaluate_predictions.multiprocessing, "get_context", lambda method: _SerialContext)
    from nnunetv2.imageio.natural_image_reader_writer import NaturalImage2DIO
    rng = np.random.default_rng(0)
    ref, pred = tmp_path / "ref", tmp_path / "pred"
    ref.mkdir()
    pred.mkdir()
    for i in range(8):
        g = (rng.random((24, 20)) < rng.uniform(0.05, 0.6)).astype(np.uint8)
        p = (rng.random((24, 20)) < rng.uniform(0.05, 0.6)).astype(np.uint8)
        if i == 0:
            g[:] = 0
            p[:] = 0  # nnU-Net: NaN, ours: 1
        if i == 1:
            p[:] = 0
        write_png(ref / f"case_{i:02d}.png", g)
        write_png(pred / f"case_{i:02d}.png", p)
    theirs = compute_metrics_on_folder(str(ref), str(pred), None, NaturalImage2DIO(), ".png", [1],
                                       num_processes=1)
    their_dice = {os.path.basename(c["prediction_file"])[:-4]: c["metrics"][1]["Dice"]
                  for c in theirs["metric_per_case"]}
    ours = evaluate_folders(str(ref), str(pred), progress=False)
    for c in ours["metric_per_case"]:
        if np.isnan(their_dice[c["case"]]):
            assert c["case"] == "case_00" and c["dice"] == 1.0
        else:
            assert c["dice"] == pytest.approx(their_dice[c["case"]], rel=1e-12, abs=1e-12)
    assert sum(np.isnan(v) for v in their_dice.values()) == 1


def _bad(argv, capsys):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("nnUNetv2_meddisseg_evaluate: error: ")
    assert len(err.strip().splitlines()) == 1
    return err


def test_missing_cases_named(hand_folders, capsys):
    ref, pred = hand_folders
    os.remove(pred / "b.png")
    os.remove(pred / "c.png")
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert "lacks 2 of 3 cases" in err and "first missing: b.png" in err


def test_different_file_endings_named(hand_folders, tmp_path, capsys):
    ref, _ = hand_folders
    pred = tmp_path / "pred_nii"
    pred.mkdir()
    for c in "abc":
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((4, 4), np.uint8)), str(pred / f"{c}.nii.gz"))
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert ".nii.gz" in err and ".png" in err


def test_label_values_outside_set_named(hand_folders, capsys):
    ref, pred = hand_folders
    write_png(pred / "c.png", np.full((4, 4), 255))
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert "c.png" in err and "{255}" in err and "0/255" in err
    write_png(pred / "c.png", np.full((4, 4), 2))
    err = _bad(["-ref", str(ref), "-pred", str(pred), "--labels", "0", "1"], capsys)
    assert "c.png" in err and "{2}" in err


def test_missing_folder_and_extra_case_and_shape(hand_folders, tmp_path, capsys):
    ref, pred = hand_folders
    err = _bad(["-ref", str(ref), "-pred", str(tmp_path / "nope")], capsys)
    assert "prediction folder not found" in err and "nope" in err
    write_png(pred / "zzz.png", np.zeros((4, 4)))
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert "zzz.png" in err
    os.remove(pred / "zzz.png")
    write_png(pred / "a.png", np.zeros((5, 4)))
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert "a.png" in err and "shape" in err


def test_corrupt_file_named(hand_folders, capsys):
    ref, pred = hand_folders
    (pred / "a.png").write_bytes(b"not a png")
    err = _bad(["-ref", str(ref), "-pred", str(pred)], capsys)
    assert "cannot read label image" in err and "a.png" in err


def test_real_command_has_no_traceback(hand_folders):
    ref, pred = hand_folders
    os.remove(pred / "a.png")
    r = subprocess.run([sys.executable, "-m", "nnunetv2_meddisseg.evaluation.evaluate", "-ref", str(ref),
                        "-pred", str(pred)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "first missing: a.png" in r.stderr


def _write_volume(path, arr, spacing=(0.8, 0.8, 2.5)):
    img = sitk.GetImageFromArray(arr.astype(np.uint8))
    img.SetSpacing(spacing)
    sitk.WriteImage(img, str(path))


def test_multiclass_nifti_with_dataset_json(tmp_path, capsys):
    ref, pred = tmp_path / "labelsTs", tmp_path / "pred"
    ref.mkdir()
    pred.mkdir()
    dj = tmp_path / "dataset.json"
    dj.write_text(json.dumps({"labels": {"background": 0, "aorta": 1, "liver": 2}, "file_ending": ".nii.gz",
                              "channel_names": {"0": "CT"}, "numTraining": 0}))
    r = np.zeros((5, 10, 10), np.uint8)
    r[1:4, 1:4, 1:4] = 1
    r[1:4, 6:9, 6:9] = 2
    p1 = r.copy()
    p1[p1 == 2] = 0                  # liver missed -> (0, 0)
    p2 = r.copy()
    p2[1:4, 1:4, 4] = 1              # aorta one voxel too wide in x
    _write_volume(ref / "v1.nii.gz", r)
    _write_volume(pred / "v1.nii.gz", p1)
    _write_volume(ref / "v2.nii.gz", r)
    _write_volume(pred / "v2.nii.gz", p2)
    out = tmp_path / "s.json"
    assert main(["-ref", str(ref), "-pred", str(pred), "-djfile", str(dj), "-o", str(out)]) == 0
    s = json.loads(out.read_text())
    v1, v2 = s["metric_per_case"]
    assert v1["per_label"]["aorta"] == {"dice": 1.0, "hd95": 0.0}
    assert v1["per_label"]["liver"] == {"dice": 0.0, "hd95": 0.0}
    assert v2["per_label"]["aorta"]["dice"] == pytest.approx(2 * 27 / (27 + 36))
    assert v2["per_label"]["aorta"]["hd95"] == pytest.approx(1.0)  # voxels, as TransUNet
    assert s["mean"]["per_label"]["liver"]["dice"] == pytest.approx(0.5)
    assert s["mean"]["dice"] == pytest.approx(np.mean([1.0, 0.0, 2 * 27 / 63, 1.0]))
    assert "aorta" in capsys.readouterr().out
    s_mm = evaluate_folders(str(ref), str(pred), load_dataset_json_labels(str(dj))[0], hd95_physical=True,
                            progress=False)
    assert s_mm["metric_per_case"][1]["per_label"]["aorta"]["hd95"] == pytest.approx(0.8)
    assert "HD95" in format_summary(s_mm)



def test_multiclass_without_declared_labels_says_what_to_pass(tmp_path, capsys):
    """Labels 0..2 under the binary default: the error names both ways to declare them, and the
    --labels form it suggests then works."""
    ref, pred = tmp_path / "labelsTs", tmp_path / "pred"
    ref.mkdir()
    pred.mkdir()
    r = np.zeros((3, 6, 6), np.uint8)
    r[1, 1:3, 1:3] = 1
    r[1, 3:5, 3:5] = 2
    _write_volume(ref / "v1.nii.gz", r)
    _write_volume(pred / "v1.nii.gz", r)
    assert main(["-ref", str(ref), "-pred", str(pred)]) == 2
    err = capsys.readouterr().err
    assert "v1.nii.gz holds label values {2} outside the declared set {0, 1}" in err
    assert "-djfile dataset.json or --labels 0 1 2)" in err
    assert main(["-ref", str(ref), "-pred", str(pred), "--labels", "0", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "label_1" in out and "label_2" in out and "100.0" in out

def test_dataset_json_file_ending_must_match(hand_folders, tmp_path, capsys):
    ref, pred = hand_folders
    dj = tmp_path / "dataset.json"
    dj.write_text(json.dumps({"labels": {"background": 0, "polyp": 1}, "file_ending": ".nii.gz"}))
    err = _bad(["-ref", str(ref), "-pred", str(pred), "-djfile", str(dj)], capsys)
    assert ".nii.gz" in err and ".png" in err
    with pytest.raises(ValueError, match="region"):
        dj.write_text(json.dumps({"labels": {"background": 0, "tumor": [1, 2]}, "file_ending": ".png"}))
        load_dataset_json_labels(str(dj))


def test_read_label_map_2d_squeezes_and_rejects_rgb(tmp_path):
    write_png(tmp_path / "x.png", np.eye(5))
    arr, spacing = read_label_map(str(tmp_path / "x.png"))
    assert arr.shape == (5, 5) and spacing == (1.0, 1.0) and arr.dtype == np.int64
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(tmp_path / "rgb.png")
    with pytest.raises(ValueError, match="single-channel"):
        read_label_map(str(tmp_path / "rgb.png"))
    (tmp_path / "r").mkdir()
    write_png(tmp_path / "r" / "a.png", np.zeros((3, 3)))
    write_png(tmp_path / "r" / "b.bmp", np.zeros((3, 3)))
    with pytest.raises(ValueError, match="several endings"):
        match_cases(str(tmp_path / "r"), str(tmp_path / "r"))
