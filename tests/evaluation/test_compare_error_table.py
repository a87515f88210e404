"""The compare command's rows of the bad-input table (harness and contract in tests/bad_input_table.py): a raw
dataset with a test set, models missing or broken under nnUNet_results, through ``nnUNetv2_meddisseg_compare``'s
``main``. The checkpoints compare hands to nnU-Net are refused, without running it, when they carry a pickle
payload."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from bad_input_table import Env, Row, check_row, write_png

COMPARE_DATASET = "Dataset802_Cmp"


def _raw_with_test_set(env: Env, labels_ts: bool = True) -> Path:
    raw = env["nnUNet_raw"] / COMPARE_DATASET
    (raw / "dataset.json").parent.mkdir(parents=True)
    (raw / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "polyp": 1},
        "numTraining": 0, "file_ending": ".png"}))
    write_png(raw / "imagesTs" / "t0_0000.png", np.zeros((8, 8, 3)))
    if labels_ts:
        write_png(raw / "labelsTs" / "t0.png", np.zeros((8, 8)))
    return raw


def _compare_argv(tmp: Path, dataset: str) -> List[str]:
    return ["-d", dataset, "--device", "cpu", "-o", str(tmp / "comparison")]


def cmp_negative_option(option: str):
    def setup(tmp, env):
        return [*_compare_argv(tmp, "802"), option, "-1"]
    return setup


def cmp_unknown_dataset(tmp, env):
    return _compare_argv(tmp, "777")


def cmp_no_test_labels(tmp, env):
    _raw_with_test_set(env, labels_ts=False)
    return _compare_argv(tmp, "802")


def cmp_baseline_model_missing(tmp, env):
    _raw_with_test_set(env)
    return _compare_argv(tmp, "802")


def cmp_meddisseg_model_missing(tmp, env):
    _raw_with_test_set(env)
    fold = env["nnUNet_results"] / COMPARE_DATASET / "nnUNetTrainer__nnUNetPlans__2d" / "fold_0"
    fold.mkdir(parents=True)
    (fold / "checkpoint_final.pth").write_bytes(b"")  # only its existence is checked before the error
    return _compare_argv(tmp, "802")


#: the entries nnU-Net's predictor reads from a checkpoint (compare checks them before handing it over)
PREDICTOR_ENTRIES = {"network_weights": {}, "trainer_name": "nnUNetTrainer", "init_args": {"configuration": "2d"}}


def _two_models(env: Env, baseline: object, meddisseg: object = None) -> Dict[str, Path]:
    """Both models' ``fold_0/checkpoint_final.pth``: bytes written as they are, anything else with torch.save
    (dicts completed with :data:`PREDICTOR_ENTRIES`)."""
    files = {}
    for name, content in (("nnUNetTrainer__nnUNetPlans__2d", baseline),
                          ("nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d", meddisseg)):
        fold = env["nnUNet_results"] / COMPARE_DATASET / name / "fold_0"
        fold.mkdir(parents=True)
        files[name] = fold / "checkpoint_final.pth"
        if isinstance(content, bytes):
            files[name].write_bytes(content)
        else:
            torch.save({**PREDICTOR_ENTRIES, **(content or {})}, files[name])
    return files


def cmp_zero_byte_checkpoint(tmp, env):
    _raw_with_test_set(env)
    _two_models(env, b"")
    return _compare_argv(tmp, "802")


def cmp_truncated_checkpoint(tmp, env):
    _raw_with_test_set(env)
    files = _two_models(env, {"network_weights": {"w": torch.zeros(1000)}})
    data = files["nnUNetTrainer__nnUNetPlans__2d"].read_bytes()
    files["nnUNetTrainer__nnUNetPlans__2d"].write_bytes(data[: len(data) // 2])
    return _compare_argv(tmp, "802")


def cmp_checkpoint_payload(tmp, env):
    from payload import Payload

    _raw_with_test_set(env)
    _two_models(env, {"network_weights": {}}, {"network_weights": {}, "logging": Payload(tmp / "payload_ran")})
    return _compare_argv(tmp, "802")


def cmp_checkpoint_not_nnunet(tmp, env):
    """A torch file that nnU-Net's predictor would fail on with a KeyError: none of the entries it reads."""
    import io

    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.zeros(2)}}, buffer)
    _raw_with_test_set(env)
    _two_models(env, buffer.getvalue())
    return _compare_argv(tmp, "802")


def cmp_output_inside_test_labels(tmp, env):
    raw = _raw_with_test_set(env)
    _two_models(env, {"network_weights": {}})
    return [*_compare_argv(tmp, "802")[:-1], str(raw / "labelsTs" / "comparison")]


ROWS = [
    Row("compare/unknown_dataset", "compare", cmp_unknown_dataset, 2,
        ["-d 777", "no dataset with this ID", "nnUNet_raw"]),
    Row("compare/no_test_labels", "compare", cmp_no_test_labels, 2, [f"{COMPARE_DATASET}/labelsTs", "not found"]),
    Row("compare/baseline_model_missing", "compare", cmp_baseline_model_missing, 2,
        ["no trained model: ", "nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth not found (train it first"]),
    Row("compare/npp_negative", "compare", cmp_negative_option("-npp"), 2, ["-npp must be 0 or more, got -1"]),
    Row("compare/num_overlays_negative", "compare", cmp_negative_option("--num_overlays"), 2,
        ["--num_overlays must be 0 or more, got -1"]),
    Row("compare/zero_byte_checkpoint", "compare", cmp_zero_byte_checkpoint, 2,
        ["nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth is empty (0 bytes)"]),
    Row("compare/truncated_checkpoint", "compare", cmp_truncated_checkpoint, 2,
        ["nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth cannot be read as a checkpoint "
         "(truncated or corrupt?"]),
    Row("compare/checkpoint_payload_not_run", "compare", cmp_checkpoint_payload, 2,
        ["nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d/fold_0/checkpoint_final.pth holds pickled objects "
         "other than tensors", "it was not loaded, since loading such objects can run code"]),
    Row("compare/checkpoint_not_nnunet", "compare", cmp_checkpoint_not_nnunet, 2,
        ["nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth is not an nnU-Net checkpoint: it has no "
         "network_weights, trainer_name, init_args"]),
    Row("compare/output_inside_test_labels", "compare", cmp_output_inside_test_labels, 2,
        ["-o ", "labelsTs/comparison is inside the input folder ", "choose a folder outside it"]),
    Row("compare/meddisseg_model_missing", "compare", cmp_meddisseg_model_missing, 2,
        ["no trained model: neither ",
         "nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d/fold_0/checkpoint_final.pth nor ",
         "nnUNetTrainerMedDisSeg__nnUNetPlans__2d/fold_0/checkpoint_final.pth found (train it first"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)
