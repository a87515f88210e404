"""The evaluate command's rows of the bad-input table (harness and contract in tests/bad_input_table.py):
three 4x4 binary PNG cases through ``nnUNetv2_meddisseg_evaluate``'s ``main``; ``-o`` points at a summary that
must not appear on errors. And a write of the summary that fails half-way (a simulated full disk)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

import numpy as np
import pytest
import SimpleITK as sitk
from bad_input_table import Row, check_row, run_entry_point, tree, write_png


def _eval_folders(tmp: Path) -> List[str]:
    mask = np.zeros((4, 4))
    mask[:2] = 1
    for case in "abc":
        write_png(tmp / "ref" / f"{case}.png", mask)
        write_png(tmp / "pred" / f"{case}.png", mask)
    return ["-ref", str(tmp / "ref"), "-pred", str(tmp / "pred"), "-o", str(tmp / "out" / "summary.json")]


def eval_ok(tmp, env):
    return _eval_folders(tmp)


def check_eval_summary(tmp, env):
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert [c["case"] for c in summary["metric_per_case"]] == ["a", "b", "c"]
    assert summary["mean"]["dice"] == 1.0


def eval_output_is_a_reference_label(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:-1], str(tmp / "ref" / "a.png")]


def eval_output_inside_prediction_folder(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:-1], str(tmp / "pred" / "summary.json")]


def eval_output_is_a_folder(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "out").mkdir()
    return [*argv[:-1], str(tmp / "out")]


def eval_missing_cases(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "pred" / "b.png").unlink()
    (tmp / "pred" / "c.png").unlink()
    return argv


def eval_different_endings(tmp, env):
    argv = _eval_folders(tmp)
    for case in "abc":
        (tmp / "pred" / f"{case}.png").unlink()
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((4, 4), np.uint8)), str(tmp / "pred" / f"{case}.nii.gz"))
    return argv


def eval_empty_prediction_folder(tmp, env):
    argv = _eval_folders(tmp)
    for case in "abc":
        (tmp / "pred" / f"{case}.png").unlink()
    return argv


def eval_prediction_folder_without_labels(tmp, env):
    argv = eval_empty_prediction_folder(tmp, env)
    (tmp / "pred" / "notes.txt").write_text("not a label image")
    return argv


def eval_mask_0_255(tmp, env):
    argv = _eval_folders(tmp)
    write_png(tmp / "pred" / "c.png", np.full((4, 4), 255))
    return argv


def eval_label_not_declared(tmp, env):
    argv = _eval_folders(tmp)
    write_png(tmp / "pred" / "b.png", np.full((4, 4), 2))
    (tmp / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "polyp": 1}, "file_ending": ".png"}))
    return [*argv, "-djfile", str(tmp / "dataset.json")]


def eval_multiclass_undeclared(tmp, env):
    """Synapse-like labels 0..8 evaluated without -djfile / --labels."""
    argv = _eval_folders(tmp)
    organs = np.arange(16).reshape(4, 4) % 9
    for case in "abc":
        write_png(tmp / "ref" / f"{case}.png", organs)
        write_png(tmp / "pred" / f"{case}.png", organs)
    return argv


def eval_ref_folder_missing(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:1], str(tmp / "labelsTs_nope"), *argv[2:]]


def eval_shape_mismatch(tmp, env):
    argv = _eval_folders(tmp)
    write_png(tmp / "pred" / "a.png", np.zeros((5, 4)))
    return argv


def eval_corrupt_prediction(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "pred" / "a.png").write_bytes(b"not a png")
    return argv


ROWS = [
    Row("evaluate/ok", "evaluate", eval_ok, 0, check=check_eval_summary),
    Row("evaluate/output_is_a_reference_label", "evaluate", eval_output_is_a_reference_label, 2,
        ["-o ", "ref/a.png is inside -ref ", "the summary would be written into the input; choose a file outside it"]),
    Row("evaluate/output_inside_prediction_folder", "evaluate", eval_output_inside_prediction_folder, 2,
        ["pred/summary.json is inside -pred "]),
    Row("evaluate/output_is_a_folder", "evaluate", eval_output_is_a_folder, 2,
        ["out is a folder: name the summary file, e.g. ", "out/summary.json"]),
    Row("evaluate/missing_cases", "evaluate", eval_missing_cases, 2,
        ["prediction folder", "lacks 2 of 3 cases", "first missing: b.png"]),
    Row("evaluate/different_file_endings", "evaluate", eval_different_endings, 2,
        ["prediction folder", ".nii.gz", ".png", "same file ending"]),
    Row("evaluate/empty_prediction_folder", "evaluate", eval_empty_prediction_folder, 2,
        ["prediction folder", "pred is empty: expected one .png file per case of the reference folder", "ref",
         "(predict into it first)"]),
    Row("evaluate/prediction_folder_without_labels", "evaluate", eval_prediction_folder_without_labels, 2,
        ["prediction folder", "pred holds no label images (", "expected one .png file per case"]),
    Row("evaluate/mask_0_255", "evaluate", eval_mask_0_255, 2, ["c.png", "{255}", "outside the declared set", "0/255"]),
    Row("evaluate/label_not_declared", "evaluate", eval_label_not_declared, 2,
        ["b.png", "{2}", "outside the declared set {0, 1}"]),
    Row("evaluate/multiclass_undeclared", "evaluate", eval_multiclass_undeclared, 2,
        ["a.png", "{2, 3, 4, 5, 6, 7, 8}", "outside the declared set {0, 1}", "-djfile dataset.json",
         "--labels 0 1 2 3 4 5 6 7 8"]),
    Row("evaluate/ref_folder_missing", "evaluate", eval_ref_folder_missing, 2,
        ["reference folder not found", "labelsTs_nope"]),
    Row("evaluate/shape_mismatch", "evaluate", eval_shape_mismatch, 2, ["a.png", "shape"]),
    Row("evaluate/corrupt_prediction", "evaluate", eval_corrupt_prediction, 2, ["cannot read label image", "a.png"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)


def test_evaluate_write_failure_leaves_nothing(tmp_path, nnunet_dirs, capsys, monkeypatch):
    """A full disk while the summary is written: one line naming the file and the OS error, no partial file left."""
    import errno

    import nnunetv2_meddisseg.evaluation.evaluate as evaluate

    argv = _eval_folders(tmp_path)
    real_dump = json.dump

    def disk_full(obj, f, **kwargs):
        f.write("{")
        raise OSError(errno.ENOSPC, "No space left on device", f.name)

    monkeypatch.setattr(evaluate.json, "dump", disk_full)
    before = tree(tmp_path)
    assert run_entry_point("evaluate", argv) == 2
    monkeypatch.setattr(evaluate.json, "dump", real_dump)
    err = capsys.readouterr().err.strip()
    summary = tmp_path / "out" / "summary.json"
    assert err == f"nnUNetv2_meddisseg_evaluate: error: cannot write the summary {summary}: No space left on device"
    assert tree(tmp_path) - before <= {"out"}  # the folder -o names may stay, never a file

