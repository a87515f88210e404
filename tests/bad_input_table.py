"""The bad-input table's harness: one row per case, each through the real command's entry point.

Every row names a command (``convert``, ``plan``, ``evaluate``, ``compare``, ``export``, ``predict_onnx``,
``pretrain``), a setup that builds the input under ``tmp_path`` and returns the command's argv, the expected exit
code and the substrings the error must contain. A failing row (exit code != 0) must print exactly one line
``<prog>: error: ...`` on stderr, naming the file or option, with no traceback, and must leave
nothing behind: the set of paths under ``tmp_path`` is the same before and after the command (no
dataset folder, no plans JSON, no summary, no comparison folder). Rows with exit code 0 are the
documented graceful paths (a JPEG-noisy mask is thresholded, ``--overwrite`` replaces a dataset)
and controls showing that the inputs the failing rows break are otherwise accepted.

No error line ever advises ``weights_only=False``. Files carrying a pickle payload (``tests/payload.py``: its
unpickling would create a file under ``tmp_path``) are refused without running it.

The rows live next to the tests of their command: tests/datasets/test_convert_error_table.py,
tests/planning/test_plan_error_table.py, tests/evaluation/test_evaluate_error_table.py,
tests/evaluation/test_compare_error_table.py, tests/deploy/test_export_error_table.py and
tests/deploy/test_predict_onnx_error_table.py and tests/pretraining/test_pretrain_error_table.py;
tests/test_bad_input_table.py checks that together they cover
every command, and names where the train rows are tested (tests/training/test_train_input_errors.py,
tests/training/test_trainer_meddisseg.py, tests/e2e/test_train_inputs.py). Nothing in the table runs nnU-Net's
planning, preprocessing or training.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from PIL import Image

from nnunetv2_meddisseg.datasets.convert import main as convert_main
from nnunetv2_meddisseg.deploy.export import main as export_main
from nnunetv2_meddisseg.deploy.predict_onnx import main as predict_onnx_main
from nnunetv2_meddisseg.evaluation.compare_models import main as compare_main
from nnunetv2_meddisseg.evaluation.evaluate import main as evaluate_main
from nnunetv2_meddisseg.planning.plan_meddisseg import main as plan_main
from nnunetv2_meddisseg.pretraining.pretrain import main as pretrain_main

__all__ = ["COMMANDS", "Env", "ROW_MODULES", "Row", "check_row", "encoder_state_dict", "row_module", "run_entry_point",
           "tree", "write_png"]

Env = Dict[str, Path]

COMMANDS: Dict[str, tuple] = {
    # name: (entry point, program name in the error line)
    "convert": (convert_main, "nnUNetv2_meddisseg_convert"),
    "plan": (plan_main, "nnUNetv2_meddisseg_plan"),
    "evaluate": (evaluate_main, "nnUNetv2_meddisseg_evaluate"),
    "compare": (compare_main, "nnUNetv2_meddisseg_compare"),
    "export": (export_main, "nnUNetv2_meddisseg_export"),
    "predict_onnx": (predict_onnx_main, "nnUNetv2_meddisseg_predict_onnx"),
    "pretrain": (pretrain_main, "nnUNetv2_meddisseg_pretrain"),
}

#: command -> (folder under tests/, module) of its rows
ROW_MODULES: Dict[str, tuple] = {
    "convert": ("datasets", "test_convert_error_table"),
    "plan": ("planning", "test_plan_error_table"),
    "evaluate": ("evaluation", "test_evaluate_error_table"),
    "compare": ("evaluation", "test_compare_error_table"),
    "export": ("deploy", "test_export_error_table"),
    "predict_onnx": ("deploy", "test_predict_onnx_error_table"),
    "pretrain": ("pretraining", "test_pretrain_error_table"),
}


@dataclass(frozen=True)
class Row:
    """One case: ``setup(tmp, env)`` builds the input and returns argv; ``check(tmp, env)`` (rows with
    exit code 0) verifies the result."""

    name: str
    command: str
    setup: Callable[[Path, Env], List[str]]
    exit_code: int
    expected: Sequence[str] = ()
    check: Optional[Callable[[Path, Env], None]] = None


def row_module(command: str) -> ModuleType:
    """The test module holding ``command``'s rows (``ROWS``) and setups."""
    folder, name = ROW_MODULES[command]
    path = str(Path(__file__).resolve().parent / folder)
    if path not in sys.path:
        sys.path.append(path)
    return importlib.import_module(name)


def run_entry_point(command: str, argv: List[str]) -> int:
    """Call the command's ``main`` in this process; its exit code whether returned or raised."""
    entry_point, _ = COMMANDS[command]
    try:
        code = entry_point(argv)
    except SystemExit as e:
        code = e.code
    return 0 if code is None else int(code)


def tree(root: Path) -> set:
    """Every path under ``root``, relative to it."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def write_png(path: Path, arr) -> None:
    """``arr`` as an 8-bit PNG at ``path`` (folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(path)


def encoder_state_dict() -> dict:
    """A freshly initialised 3-channel ResNet-50 encoder's state dict."""
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder

    return ResNet50Encoder(3).state_dict()


def check_row(row: Row, tmp_path: Path, env: Env, capsys) -> None:
    """Run ``row`` in ``tmp_path / "work"`` and check the contract of the module docstring."""
    work = tmp_path / "work"
    work.mkdir()
    argv = row.setup(work, env)
    capsys.readouterr()  # drop what a setup's own command printed
    before = tree(tmp_path)
    code = run_entry_point(row.command, argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert "weights_only" not in err  # never the advice to load with weights_only=False
    assert code == row.exit_code, f"exit code {code}, expected {row.exit_code}; stderr: {err}"
    if row.exit_code == 0:
        row.check(work, env)
        return
    lines = err.strip().splitlines()
    prefix = f"{COMMANDS[row.command][1]}: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), f"expected one '{prefix}...' line, got:\n{err}"
    for text in row.expected:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    after = tree(tmp_path)
    assert after == before, f"left behind: {sorted(after - before)}, removed: {sorted(before - after)}"
