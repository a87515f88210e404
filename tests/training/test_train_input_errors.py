"""The train rows of the bad-input table (tests/bad_input_table.py) that need no training run: the checkpoint
``nnUNetv2_train --c`` resumes from (truncated, or carrying a pickle payload: refused without running it), and
nnU-Net's own ``nnUNetv2_train`` (marked e2e: it starts a process) run on hand-written plans until our trainer
refuses its input (a seed that is no integer, plans whose recipe names an unknown setting, ``--c`` with a
truncated checkpoint): one line ``nnUNetv2_train: error: ...`` and no traceback. The rows that train are in
tests/e2e/test_train_inputs.py; ``-c 3d_fullres``, NaN input and batch size 1 in test_trainer_meddisseg.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# nnUNetv2_train --c: the checkpoint our trainers resume from (read before nnU-Net reads it)


def test_truncated_checkpoint_latest_names_the_file_and_checkpoint_best(tmp_path):
    from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming
    from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

    latest, best = tmp_path / "checkpoint_latest.pth", tmp_path / "checkpoint_best.pth"
    torch.save({"network_weights": {"w": torch.zeros(1000)}}, best)
    latest.write_bytes(best.read_bytes()[:1500])
    with pytest.raises(TrainingInputRuntimeError) as e:  # a RuntimeError, printed by nnUNetv2_train as one line
        read_checkpoint_for_resuming(str(latest))
    message = str(e.value)
    assert message.startswith(f"cannot read the checkpoint {latest} (truncated or corrupt? ")
    assert message.endswith(f"): copy {best} over it to resume from the best epoch, or train again without --c")
    assert "\n" not in message
    best.unlink()
    with pytest.raises(RuntimeError, match=r"\): train again without --c$"):
        read_checkpoint_for_resuming(str(latest))


def test_resuming_from_a_checkpoint_carrying_code_is_refused(tmp_path):
    from payload import Payload

    from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming
    from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

    torch.save({"network_weights": {}, "logging": {"x": [Payload(tmp_path / "payload_ran")]}},
               tmp_path / "checkpoint_latest.pth")
    with pytest.raises(TrainingInputRuntimeError, match="it was not loaded, since loading such objects can run code"):
        read_checkpoint_for_resuming(str(tmp_path / "checkpoint_latest.pth"))
    assert not (tmp_path / "payload_ran").exists()


# ------------------------------------------------------------------------------------------------
# nnUNetv2_train (nnU-Net's console command, not ours): an input mistake our trainers raise ends it with one line
# ``nnUNetv2_train: error: ...`` and no traceback (the errors are SystemExits whose code is that line)

TRAIN_PROG = "nnUNetv2_train"


def _training_folders(root: Path) -> dict:
    """The environment for nnU-Net's commands with Dataset999_Tiny's plans (the hand-written 32x32 plans of
    tests/training/test_trainer_meddisseg.py) and dataset.json in nnUNet_preprocessed and one placeholder case
    (nnU-Net infers its dataset class from it; never read): enough to construct and initialize a trainer."""
    from nnunet_cli import nnunet_env
    from test_trainer_meddisseg import DATASET, DATASET_JSON, tiny_plans

    env = nnunet_env(root)
    folder = Path(env["nnUNet_preprocessed"]) / DATASET
    (folder / "nnUNetPlans_2d").mkdir(parents=True)
    (folder / "nnUNetPlans_2d" / "case_000.b2nd").touch()
    (folder / "nnUNetPlans.json").write_text(json.dumps(tiny_plans()))
    (folder / "dataset.json").write_text(json.dumps(DATASET_JSON))
    env.pop("nnUNet_meddisseg_seed", None)
    return env


def _train_error(env: dict, *extra: str) -> str:
    """Run ``nnUNetv2_train 999 2d 0 -tr nnUNetTrainerMedDisSeg -device cpu`` (plus ``extra``), which must fail
    without a traceback; its last non-empty stderr line."""
    from nnunet_cli import run_cli

    proc = run_cli([TRAIN_PROG, "999", "2d", "0", "-tr", "nnUNetTrainerMedDisSeg", "-device", "cpu", *extra], env,
                   check=False, timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, f"nothing on stderr; stdout:\n{proc.stdout[-2000:]}"
    # one error line, the last; lines before it are warnings of nnU-Net's imports (timm's FutureWarning)
    assert [line for line in lines if line.startswith(f"{TRAIN_PROG}: error: ")] == lines[-1:], proc.stderr
    return lines[-1]


@pytest.mark.e2e
def test_train_with_a_seed_that_is_no_integer_is_one_line(tmp_path):
    env = _training_folders(tmp_path)
    env["nnUNet_meddisseg_seed"] = "abc"
    assert _train_error(env) == f"{TRAIN_PROG}: error: nnUNet_meddisseg_seed must be an integer >= 0, got 'abc'"


@pytest.mark.e2e
def test_train_on_plans_with_an_unknown_recipe_setting_is_one_line(tmp_path):
    env = _training_folders(tmp_path)
    plans_file = next(Path(env["nnUNet_preprocessed"]).glob("*/nnUNetPlans.json"))
    plans = json.loads(plans_file.read_text())
    plans["meddisseg_recipe"] = {"num_epoch": 20}
    plans_file.write_text(json.dumps(plans))
    line = _train_error(env)
    assert line.startswith(f"{TRAIN_PROG}: error: plans nnUNetPlans: meddisseg_recipe: unknown setting 'num_epoch' "
                           f"for MedDisSegRecipe (known: "), line


@pytest.mark.e2e
def test_train_continuing_from_a_truncated_checkpoint_is_one_line(tmp_path):
    env = _training_folders(tmp_path)
    fold = Path(env["nnUNet_results"]) / "Dataset999_Tiny" / "nnUNetTrainerMedDisSeg__nnUNetPlans__2d" / "fold_0"
    fold.mkdir(parents=True)
    torch.save({"network_weights": {"w": torch.zeros(1000)}}, fold / "checkpoint_best.pth")
    (fold / "checkpoint_latest.pth").write_bytes((fold / "checkpoint_best.pth").read_bytes()[:1500])
    line = _train_error(env, "--c")
    assert line.startswith(f"{TRAIN_PROG}: error: cannot read the checkpoint {fold / 'checkpoint_latest.pth'} "
                           f"(truncated or corrupt? ")
    assert line.endswith(f"): copy {fold / 'checkpoint_best.pth'} over it to resume from the best epoch, or train "
                         f"again without --c")


def test_an_uncaught_training_input_error_is_one_line_without_a_traceback(tmp_path):
    """Python prints the error's line (its ``SystemExit`` code), named by the program, and exits with status 1."""
    import subprocess

    program = tmp_path / TRAIN_PROG
    program.write_text("from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError\n"
                       "raise TrainingInputRuntimeError('cannot read the checkpoint x.pth (truncated or corrupt?\\n"
                       "  EOFError: )')\n")
    proc = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (
        1, f"{TRAIN_PROG}: error: cannot read the checkpoint x.pth (truncated or corrupt? EOFError: )\n")


def test_the_trainer_catalogue_leaves_the_excepthook_alone(monkeypatch):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    from nnunetv2_meddisseg.environment import trainer_folder

    def previous(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", previous)
    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    recursive_find_trainer_class_by_name("nnUNetTrainerMedDisSeg")  # imports the catalogue
    assert sys.excepthook is previous


def test_training_input_errors_are_user_errors_and_system_exits(monkeypatch):
    from nnunetv2_meddisseg.errors import UserError
    from nnunetv2_meddisseg.training.errors import TrainingInputError, TrainingInputRuntimeError

    assert issubclass(TrainingInputError, UserError) and issubclass(TrainingInputError, ValueError)
    assert issubclass(TrainingInputRuntimeError, TrainingInputError)
    assert issubclass(TrainingInputRuntimeError, RuntimeError)
    monkeypatch.setattr(sys, "argv", [str(Path("venv") / "bin" / TRAIN_PROG), "999", "2d", "0"])
    error = TrainingInputError("encoder weights file not found: x.pth\n (the plans' encoder_weights)")
    assert isinstance(error, SystemExit) and isinstance(error, Exception)
    assert str(error) == "encoder weights file not found: x.pth\n (the plans' encoder_weights)"
    assert error.code == f"{TRAIN_PROG}: error: encoder weights file not found: x.pth (the plans' encoder_weights)"
