"""The exporter's rows of the bad-input table (harness and contract in tests/bad_input_table.py), through
``nnUNetv2_meddisseg_export``'s ``main``: where ``-o`` may not write and bad option values, refused before the
model is loaded (the model folder under nnUNet_results holds a placeholder checkpoint of plain tensors, which the
refusal never reaches); and bad inputs of the export's check and of the reduced precisions' guard (the model
folder's JSON files, nnUNet_preprocessed unset, damaged preprocessed cases, splits_final.json), on a tiny plain
U-Net whose checkpoint is written directly, untrained (:func:`tiny_model`; no training, the export takes a few
seconds). The rows that unset nnUNet_preprocessed do so in their setup; the ``nnunet_dirs`` fixture sets it again
for the next test."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, List, Sequence

import numpy as np
import pytest
import torch
from bad_input_table import Env, Row, check_row
from test_export_folder import DATASET, earlier_export

from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, read_description

_TRAINING_TESTS = str(Path(__file__).resolve().parents[1] / "training")
if _TRAINING_TESTS not in sys.path:
    sys.path.append(_TRAINING_TESTS)


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


#: the tiny model's preprocessed cases, and the split of its fold 0
CASES = [f"case_{i:03d}" for i in range(6)]
SPLIT = {"train": CASES[:4], "val": CASES[4:]}


def tiny_model(env: Env) -> Path:
    """A model folder as nnU-Net's training leaves it (plans.json, dataset.json, fold 0's checkpoint) of the tiny
    plain U-Net of tests/training/test_trainer_meddisseg.py (3 channels, 3 classes, 32x32 patch), untrained."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
    from test_trainer_meddisseg import DATASET_JSON, tiny_plans

    plans = dict(tiny_plans(), dataset_name=DATASET)
    manager = PlansManager(plans)
    torch.manual_seed(0)
    network = nnUNetTrainer.build_network_architecture(manager, manager.get_configuration("2d"), 3, 3, False)
    folder = env["nnUNet_results"] / DATASET / "nnUNetTrainer__nnUNetPlans__2d"
    (folder / "fold_0").mkdir(parents=True)
    (folder / "plans.json").write_text(json.dumps(plans))
    (folder / "dataset.json").write_text(json.dumps(DATASET_JSON))
    torch.save({"network_weights": network.state_dict(), "trainer_name": "nnUNetTrainer",
                "init_args": {"configuration": "2d"}, "inference_allowed_mirroring_axes": (0, 1)},
               folder / "fold_0" / "checkpoint_final.pth")
    return folder


def preprocessed_cases(env: Env, cases: Sequence[str] = CASES, channels: int = 3, splits=None) -> Path:
    """The tiny model's preprocessed folder as nnUNetv2_preprocess writes it (blosc2 ``.b2nd`` cases, 40x36, and
    their properties) and ``splits_final.json`` beside it (``splits``, default one fold of :data:`SPLIT`; a string
    is written as it is)."""
    import blosc2
    from batchgenerators.utilities.file_and_folder_operations import write_pickle

    folder = env["nnUNet_preprocessed"] / DATASET / "nnUNetPlans_2d"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in cases:
        data = rng.standard_normal((channels, 1, 40, 36)).astype(np.float32)
        seg = (data[:1] > 0.5).astype(np.int8)
        blosc2.asarray(data, urlpath=str(folder / f"{name}.b2nd"), mode="w")
        blosc2.asarray(seg, urlpath=str(folder / f"{name}_seg.b2nd"), mode="w")
        write_pickle({"spacing": [999.0, 1.0, 1.0], "shape_before_cropping": [1, 40, 36]}, str(folder / f"{name}.pkl"))
    splits = [SPLIT] if splits is None else splits
    (folder.parent / "splits_final.json").write_text(splits if isinstance(splits, str) else json.dumps(splits))
    return folder


def _export_argv(tmp: Path, *flags: str) -> List[str]:
    return [*_argv(tmp / "kvasir_onnx"), *flags]


def truncate(path: Path) -> None:
    """``path`` cut to half its size (an interrupted copy)."""
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def exp_option(*flags: str) -> Callable[[Path, Env], List[str]]:
    def setup(tmp, env):
        _model(env)
        return _export_argv(tmp, *flags)
    return setup


def exp_without_nnunet_preprocessed(*flags: str) -> Callable[[Path, Env], List[str]]:
    def setup(tmp, env):
        tiny_model(env)
        del os.environ["nnUNet_preprocessed"]
        return _export_argv(tmp, *flags)
    return setup


def exp_model_file(name: str, content: str) -> Callable[[Path, Env], List[str]]:
    """The trained model with its ``name`` (plans.json, dataset.json) replaced by ``content`` (None: removed)."""
    def setup(tmp, env):
        folder = tiny_model(env)
        if content is None:
            (folder / name).unlink()
        else:
            (folder / name).write_text(content)
        return _export_argv(tmp)
    return setup


def exp_preprocessed(damage: Callable[[Path], None], *flags: str, **cases) -> Callable[[Path, Env], List[str]]:
    """The trained model and its preprocessed cases (``cases``: :func:`preprocessed_cases`' options), ``damage``
    done to their folder."""
    def setup(tmp, env):
        tiny_model(env)
        damage(preprocessed_cases(env, **cases))
        return _export_argv(tmp, *flags)
    return setup


def _exported(tmp, env):
    assert (tmp / "kvasir_onnx" / DESCRIPTION_FILE).is_file() and (tmp / "kvasir_onnx" / "fold_0").is_dir()
    read_description(tmp / "kvasir_onnx")  # what the export builds is what the predictor reads


def exp_labels_the_predictor_cannot_read(tmp, env):
    """A dataset.json whose labels nnU-Net loads but the ONNX predictor cannot read (not consecutive)."""
    from test_trainer_meddisseg import DATASET_JSON

    folder = tiny_model(env)
    (folder / "dataset.json").write_text(json.dumps({**DATASET_JSON, "labels": {"background": 0, "a": 1, "b": 3}}))
    return _export_argv(tmp)


def _nothing(folder: Path) -> None:
    pass


def _splits_text(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder.parent / "splits_final.json").write_text(text)


exp_truncated_case = exp_preprocessed(lambda folder: truncate(folder / "case_000.b2nd"))
exp_int8_splits_truncated = exp_preprocessed(_splits_text('[{"train": ["case_0'), "--int8")
exp_int8_splits_an_object = exp_preprocessed(_splits_text(json.dumps(SPLIT)), "--int8")
exp_int8_fold_without_training_cases = exp_preprocessed(_nothing, "--int8", splits=[{"train": [], "val": CASES}])
exp_int8_fold_without_validation_cases = exp_preprocessed(_nothing, "--int8", splits=[{"train": CASES, "val": []}])


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
    Row("export/max_pseudo_dice_drop_nan", "export", exp_option("--int8", "--max_pseudo_dice_drop", "nan"), 2,
        ["--max_pseudo_dice_drop must be a finite number of points, got nan"]),
    Row("export/max_pseudo_dice_drop_inf", "export", exp_option("--int8", "--max_pseudo_dice_drop", "inf"), 2,
        ["--max_pseudo_dice_drop must be a finite number of points, got inf"]),
    Row("export/min_dice_to_fp32_nan", "export", exp_option("--int8", "--min_dice_to_fp32", "nan"), 2,
        ["--min_dice_to_fp32 must be in (0, 1], got nan"]),
    Row("export/tolerance_nan", "export", exp_option("--tolerance", "nan"), 2,
        ["--tolerance must be positive and finite, got nan"]),
    Row("export/tolerance_inf", "export", exp_option("--tolerance", "inf"), 2,
        ["--tolerance must be positive and finite, got inf"]),
    Row("export/dataset_json_missing", "export", exp_model_file("dataset.json", None), 2,
        ["nnUNetTrainer__nnUNetPlans__2d/dataset.json: not found"]),
    Row("export/plans_json_truncated", "export", exp_model_file("plans.json", '{"dataset_name": "Data'), 2,
        ["nnUNetTrainer__nnUNetPlans__2d/plans.json: not valid JSON (truncated?"]),
    Row("export/plans_json_a_list", "export", exp_model_file("plans.json", "[]"), 2,
        ["plans.json: expected a JSON object"]),
    Row("export/fp32_without_nnunet_preprocessed", "export", exp_without_nnunet_preprocessed(), 0,
        check=_exported),
    Row("export/int8_without_nnunet_preprocessed", "export", exp_without_nnunet_preprocessed("--int8"), 2,
        ["--int8 needs nnUNet_preprocessed, which is not set", "training and validation cases", "export fp32 alone"]),
    Row("export/bf16_without_nnunet_preprocessed", "export", exp_without_nnunet_preprocessed("--bf16"), 2,
        ["--bf16 needs nnUNet_preprocessed, which is not set"]),
    Row("export/fp32_with_preprocessed_cases", "export", exp_preprocessed(_nothing), 0, check=_exported),
    Row("export/labels_the_predictor_cannot_read", "export", exp_labels_the_predictor_cannot_read, 2,
        [f"kvasir_onnx/{DESCRIPTION_FILE}: labels must be the values 0, 1, ..., K-1 (consecutive, as nnU-Net "
         "requires), got [0, 1, 3]"]),
    Row("export/fold_named_twice", "export", exp_option("-f", "0", "0"), 2, ["-f 0 0: a fold named twice"]),
    Row("export/truncated_preprocessed_case", "export", exp_truncated_case, 2,
        ["nnUNetPlans_2d/case_000.b2nd: cannot be read as a preprocessed case (truncated or damaged?",
         "run nnUNetv2_preprocess"]),
    Row("export/preprocessed_case_of_other_channels", "export", exp_preprocessed(_nothing, channels=1), 2,
        ["case_000.b2nd: holds 1 channel(s), the model takes 3"]),
    Row("export/int8_truncated_validation_case", "export",
        exp_preprocessed(lambda folder: truncate(folder / "case_005_seg.b2nd"), "--int8"), 2,
        ["nnUNetPlans_2d/case_005_seg.b2nd: cannot be read as a preprocessed case"]),
    Row("export/int8_validation_case_missing", "export",
        exp_preprocessed(lambda folder: (folder / "case_004_seg.b2nd").unlink(), "--int8"), 2,
        ["nnUNetPlans_2d/case_004_seg.b2nd: not found"]),
    Row("export/int8_splits_truncated", "export", exp_int8_splits_truncated, 2,
        ["splits_final.json: not valid JSON (truncated?", "expected nnU-Net's list of splits"]),
    Row("export/int8_splits_an_object", "export", exp_int8_splits_an_object, 2,
        ["splits_final.json: expected nnU-Net's list of splits, one object per fold", "got an object"]),
    Row("export/int8_splits_without_val", "export",
        exp_preprocessed(_splits_text(json.dumps([{"train": CASES}])), "--int8"), 2,
        ["splits_final.json: expected nnU-Net's list of splits", "fold 0 is null as its 'val'"]),
    Row("export/int8_fold_without_training_cases", "export", exp_int8_fold_without_training_cases, 2,
        ["fold 0 of ", "splits_final.json has no training cases to calibrate INT8 on"]),
    Row("export/int8_fold_without_validation_cases", "export", exp_int8_fold_without_validation_cases, 2,
        ["fold 0 of ", "splits_final.json has no validation cases to verify a reduced precision on"]),
    Row("export/int8_preprocessed_folder_empty", "export",
        exp_preprocessed(_nothing, "--int8", cases=()), 2,
        ["nnUNetPlans_2d: no preprocessed case case_000 (.b2nd, .npy or .npz)"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)


@pytest.mark.parametrize("preprocessed", ["unset", "empty"])
def test_fp32_export_without_preprocessed_cases_says_it_checks_on_random_inputs_only(preprocessed, tmp_path,
                                                                                     nnunet_dirs, capsys, monkeypatch):
    from nnunetv2_meddisseg.deploy.export import main

    tiny_model(nnunet_dirs)
    if preprocessed == "unset":
        monkeypatch.delenv("nnUNet_preprocessed")
        why = "nnUNet_preprocessed is not set"
    else:
        why = f"none in {preprocessed_cases(nnunet_dirs, cases=())}"
    assert main(_export_argv(tmp_path)) == 0
    out = capsys.readouterr().out
    assert f"no preprocessed cases ({why}): ONNX Runtime is checked against PyTorch on random inputs only" in out
    assert "(2 inputs)" in out and (tmp_path / "kvasir_onnx" / DESCRIPTION_FILE).is_file()
    checks = json.loads((tmp_path / "kvasir_onnx" / DESCRIPTION_FILE).read_text())["folds"][0]["checks"]
    assert [c["input"] for c in checks] == ["random patches", "random input of twice the patch size"]


def test_fp32_export_checks_on_two_preprocessed_cases_where_there(tmp_path, nnunet_dirs, capsys):
    from nnunetv2_meddisseg.deploy.export import main

    tiny_model(nnunet_dirs)
    preprocessed_cases(nnunet_dirs)
    assert main(_export_argv(tmp_path)) == 0
    assert "no preprocessed cases" not in capsys.readouterr().out
    checks = json.loads((tmp_path / "kvasir_onnx" / DESCRIPTION_FILE).read_text())["folds"][0]["checks"]
    assert [c["input"] for c in checks][2:] == ["case case_000", "case case_001"]


def test_an_int8_export_guards_int8_alone(tmp_path, nnunet_dirs, monkeypatch):
    """--int8 runs the INT8 guard only; bf16 is guarded where --bf16 asks for it too."""
    from nnunetv2_meddisseg.deploy import export

    asked = []
    monkeypatch.setattr(export, "guard_folds", lambda description, models, preprocessed, precisions, *args:
                        asked.append(sorted(precisions)) or {})
    tiny_model(nnunet_dirs)
    preprocessed_cases(nnunet_dirs)
    assert export.main(_export_argv(tmp_path / "int8", "--int8")) == 0
    assert export.main(_export_argv(tmp_path / "both", "--int8", "--bf16")) == 0
    assert asked == [["int8"], ["bf16", "int8"]]
