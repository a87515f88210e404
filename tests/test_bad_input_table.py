"""The bad-input table as a whole (tests/bad_input_table.py): its rows, spread over the commands' test folders,
cover every command with one exit code for user mistakes, and the train rows tested outside the table exist.

The train rows: ``-c 3d_fullres``, input with NaN and batch size 1 in tests/training/test_trainer_meddisseg.py;
single-channel CT input, 4-channel input and ``--c`` without a checkpoint through the real ``nnUNetv2_train`` in
tests/e2e/test_train_inputs.py; a bad seed, recipe file or checkpoint to resume from in
tests/training/test_train_input_errors.py.
"""
from __future__ import annotations

from pathlib import Path

from bad_input_table import COMMANDS, row_module

ROWS = [row for command in COMMANDS for row in row_module(command).ROWS]

# the train rows of the bad-input table, tested outside the table: case -> (file, test)
TRAIN_ROWS = {
    "-c 3d_fullres": ("training/test_trainer_meddisseg.py",
                      "test_3d_configuration_is_refused_before_anything_is_written"),
    "batch size 1": ("training/test_trainer_meddisseg.py", "test_batch_size_one_warns_once_and_has_zero_dispersion"),
    "input with NaN": ("training/test_trainer_meddisseg.py", "test_nan_input_is_a_clear_error"),
    "single-channel CT": ("e2e/test_train_inputs.py",
                          "test_single_channel_ct_trains_and_continue_without_checkpoint_starts_fresh"),
    "4-channel input": ("e2e/test_train_inputs.py", "test_four_channel_input_trains_with_meddisseg_plans"),
    "--c without checkpoint": ("e2e/test_train_inputs.py",
                               "test_single_channel_ct_trains_and_continue_without_checkpoint_starts_fresh"),
}


def test_table_covers_every_command_and_train_row():
    failing = [r for r in ROWS if r.exit_code != 0]
    assert len(failing) >= 20
    assert {r.exit_code for r in failing} == {2}  # one exit code for every command's user mistakes (README)
    assert {r.command for r in failing} == set(COMMANDS)
    assert all(r.expected for r in failing) and all(r.check for r in ROWS if r.exit_code == 0)
    tests = Path(__file__).resolve().parent
    for case, (file, test) in TRAIN_ROWS.items():
        assert f"\ndef {test}(" in (tests / file).read_text(), f"train row {case!r}: {test} not in tests/{file}"
