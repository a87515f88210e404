"""The pretraining command's rows of the bad-input table (harness and contract in tests/bad_input_table.py), through
``nnUNetv2_meddisseg_pretrain``'s ``main`` on the hand-written tiny dataset of tests/pretraining/tiny_dataset.py:
each mistake is one line naming the option or file, and nothing is written (no output, no checkpoint)."""
from __future__ import annotations

import pytest
import torch
from bad_input_table import Row, check_row
from tiny_dataset import DATASET, tiny_dataset


def _argv(tmp, *extra):
    return ["-d", DATASET, "-f", "0", "-o", str(tmp / "pre.pth"), "--device", "cpu", "--no_progress", "--epochs", "1",
            "--iterations_per_epoch", "1", *extra]


def pretrain_ok(tmp, env):
    tiny_dataset(env)
    return _argv(tmp)


def check_written(tmp, env):
    assert sorted(p.name for p in tmp.iterdir()) == ["pre.pth"]
    assert torch.load(tmp / "pre.pth", weights_only=True)["pretraining"]["epochs"] == 1


def unknown_dataset(tmp, env):
    argv = _argv(tmp)
    argv[argv.index("-d") + 1] = "932"
    return argv


def unknown_plans(tmp, env):
    tiny_dataset(env)
    return _argv(tmp, "-p", "nnUNetMedDisSegPlans")


def output_in(folder: str):
    def setup(tmp, env):
        tiny_dataset(env)
        argv = _argv(tmp)
        argv[argv.index("-o") + 1] = str(env[folder] / DATASET / "pre.pth")
        return argv
    return setup


def output_exists(tmp, env):
    tiny_dataset(env)
    (tmp / "pre.pth").write_bytes(b"someone's file")
    return _argv(tmp)


def output_folder_missing(tmp, env):
    tiny_dataset(env)
    argv = _argv(tmp)
    argv[argv.index("-o") + 1] = str(tmp / "nowhere" / "pre.pth")
    return argv


def fold_out_of_range(tmp, env):
    tiny_dataset(env)
    argv = _argv(tmp)
    argv[argv.index("-f") + 1] = "3"
    return argv


def unlabelled_is_test_folder(tmp, env):
    tiny_dataset(env)
    return _argv(tmp, "--unlabelled_folder", str(env["nnUNet_raw"] / DATASET / "imagesTs"))


def checkpoint_of_other_settings(tmp, env):
    tiny_dataset(env)
    torch.save({"settings": {"epochs": 5}, "epoch": 1}, tmp / "pre.pth.checkpoint")
    return _argv(tmp)


def zero_epochs(tmp, env):
    tiny_dataset(env)
    argv = _argv(tmp)
    argv[argv.index("--epochs") + 1] = "0"
    return argv


ROWS = [
    Row("pretrain/ok", "pretrain", pretrain_ok, 0, check=check_written),
    Row("pretrain/unknown_dataset", "pretrain", unknown_dataset, 2, ["-d 932", "nnUNetv2_plan_and_preprocess"]),
    Row("pretrain/unknown_plans", "pretrain", unknown_plans, 2,
        ["-p nnUNetMedDisSegPlans", "nnUNetMedDisSegPlans.json not found"]),
    Row("pretrain/output_in_preprocessed", "pretrain", output_in("nnUNet_preprocessed"), 2,
        ["is inside nnUNet_preprocessed", "never writes into its inputs"]),
    Row("pretrain/output_in_raw", "pretrain", output_in("nnUNet_raw"), 2, ["is inside nnUNet_raw"]),
    Row("pretrain/output_exists", "pretrain", output_exists, 2, ["pre.pth exists", "pre.pth.checkpoint"]),
    Row("pretrain/output_folder_missing", "pretrain", output_folder_missing, 2, ["nowhere", "does not exist"]),
    Row("pretrain/fold_out_of_range", "pretrain", fold_out_of_range, 2, ["-f 3", "splits_final.json has 1 folds"]),
    Row("pretrain/unlabelled_is_imagesTs", "pretrain", unlabelled_is_test_folder, 2,
        ["--unlabelled_folder", "imagesTs", "never reads them"]),
    Row("pretrain/checkpoint_of_other_settings", "pretrain", checkpoint_of_other_settings, 2,
        ["pre.pth.checkpoint", "other settings (epochs differs)"]),
    Row("pretrain/zero_epochs", "pretrain", zero_epochs, 2, ["--epochs", "at least 1"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)
