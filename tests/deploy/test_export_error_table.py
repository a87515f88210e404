"""The exporter's rows of the bad-input table (harness and contract in tests/bad_input_table.py): where ``-o`` may
not write, refused through ``nnUNetv2_meddisseg_export``'s ``main`` before the model is loaded (the model folder
under nnUNet_results holds a placeholder checkpoint of plain tensors, which the refusal never reaches)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import torch
from bad_input_table import Env, Row, check_row
from test_export_folder import DATASET, earlier_export


def _model(env: Env) -> Path:
    folder = env["nnUNet_results"] / DATASET / "nnUNetTrainer__nnUNetPlans__2d"
    (folder / "fold_0").mkdir(parents=True)
    torch.save({"network_weights": {"w": torch.zeros(2)}}, folder / "fold_0" / "checkpoint_final.pth")
    return folder


def _argv(output) -> List[str]:
    return ["-d", DATASET, "-f", "0", "-o", str(output)]


def exp_output_is_a_file(tmp, env):
    _model(env)
    (tmp / "kvasir_onnx").write_text("not a folder")
    return _argv(tmp / "kvasir_onnx")


def exp_output_is_a_user_folder(tmp, env):
    _model(env)
    (tmp / "results").mkdir()
    (tmp / "results" / "table.csv").write_text("mine")
    return _argv(tmp / "results")


def exp_output_is_the_model_folder(tmp, env):
    return _argv(_model(env))


def exp_output_in(name: str):
    def setup(tmp, env):
        _model(env)
        return _argv(env[name] / "kvasir_onnx")
    return setup


def exp_export_with_a_user_file(tmp, env):
    _model(env)
    earlier_export(tmp / "kvasir_onnx")
    (tmp / "kvasir_onnx" / "README.txt").write_text("mine")
    return _argv(tmp / "kvasir_onnx")


def exp_export_with_a_user_file_in_a_fold(tmp, env):
    _model(env)
    earlier_export(tmp / "kvasir_onnx")
    (tmp / "kvasir_onnx" / "fold_0" / "predictions.csv").write_text("mine")
    return _argv(tmp / "kvasir_onnx")


def exp_export_with_a_fold_it_does_not_record(tmp, env):
    _model(env)
    earlier_export(tmp / "kvasir_onnx")
    (tmp / "kvasir_onnx" / "fold_3").mkdir()
    (tmp / "kvasir_onnx" / "fold_3" / "model.onnx").write_bytes(b"mine")
    return _argv(tmp / "kvasir_onnx")


def exp_output_under_a_file(tmp, env):
    _model(env)
    (tmp / "a_file").write_text("x")
    return _argv(tmp / "a_file" / "kvasir_onnx")


ROWS = [
    Row("export/output_is_a_file", "export", exp_output_is_a_file, 2,
        ["-o ", "kvasir_onnx exists and is not a folder"]),
    Row("export/output_is_a_user_folder", "export", exp_output_is_a_user_folder, 2,
        ["-o ", "results exists and is not an export of nnUNetv2_meddisseg_export",
         "-o replaces only an earlier export"]),
    Row("export/output_is_the_model_folder", "export", exp_output_is_the_model_folder, 2,
        ["nnUNetTrainer__nnUNetPlans__2d is inside the model folder", "default place"]),
    Row("export/output_in_nnunet_raw", "export", exp_output_in("nnUNet_raw"), 2,
        ["is inside nnUNet_raw", "whose folders belong to nnU-Net"]),
    Row("export/output_in_nnunet_preprocessed", "export", exp_output_in("nnUNet_preprocessed"), 2,
        ["is inside nnUNet_preprocessed"]),
    Row("export/output_in_nnunet_results", "export", exp_output_in("nnUNet_results"), 2,
        ["is inside nnUNet_results"]),
    Row("export/export_with_a_user_file", "export", exp_export_with_a_user_file, 2,
        ["is an earlier export but also holds README.txt, which the export did not write"]),
    Row("export/export_with_a_user_file_in_a_fold", "export", exp_export_with_a_user_file_in_a_fold, 2,
        ["is an earlier export but also holds fold_0/predictions.csv, which the export did not write"]),
    Row("export/export_with_a_fold_it_does_not_record", "export", exp_export_with_a_fold_it_does_not_record, 2,
        ["is an earlier export but also holds fold_3, fold_3/model.onnx, which the export did not write"]),
    Row("export/output_under_a_file", "export", exp_output_under_a_file, 2,
        ["cannot write ", "a_file/kvasir_onnx: ", "a_file is not a folder"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)
