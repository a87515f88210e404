"""Every console command's ``-h``: each option has a help line stating its default, no reStructuredText
backticks, and every ``--device`` follows one rule (cuda if available, else cpu)."""
from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from nnunetv2_meddisseg.cli import DEVICE_DEFAULT_TEXT, STATES_DEFAULT, DefaultsHelpFormatter, resolve_device

ROOT = Path(__file__).resolve().parents[1]


def console_scripts() -> dict:
    """``{command: module}`` of setup.py's console_scripts."""
    text = (ROOT / "setup.py").read_text()
    return dict(re.findall(r'"(nnUNetv2_meddisseg_\w+)=([\w.]+):main"', text))


COMMANDS = console_scripts()


def _parser(module: str) -> argparse.ArgumentParser:
    return importlib.import_module(module)._parser()


def test_every_console_script_is_covered():
    assert len(COMMANDS) >= 7
    assert {"nnUNetv2_meddisseg_plan", "nnUNetv2_meddisseg_compare", "nnUNetv2_meddisseg_demo"} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help_with_its_default(command):
    parser = _parser(COMMANDS[command])
    assert parser.prog == command
    help_text = parser.format_help()
    assert "`" not in help_text, f"{command} -h shows backticks"
    formatter = DefaultsHelpFormatter(command)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action)
        assert action.help, f"{command} {action.option_strings or action.dest}: no help text"
        if action.option_strings and not action.required:
            assert STATES_DEFAULT.search(text), \
                f"{command} {action.option_strings}: help does not state the default: {text!r}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_device_options_follow_one_rule(command):
    devices = [a for a in _parser(COMMANDS[command])._actions if "--device" in a.option_strings]
    for action in devices:
        assert action.default is None and f"(default: {DEVICE_DEFAULT_TEXT})" in action.help


def test_device_commands_are_the_ones_running_networks():
    with_device = {c for c, m in COMMANDS.items() if any("--device" in a.option_strings for a in _parser(m)._actions)}
    assert with_device == {"nnUNetv2_meddisseg_compare", "nnUNetv2_meddisseg_demo", "nnUNetv2_meddisseg_ablate",
                           "nnUNetv2_meddisseg_features", "nnUNetv2_meddisseg_pretrain"}


def test_resolve_device(monkeypatch):
    import torch

    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == "cuda"


def test_formatter_appends_defaults_once():
    p = argparse.ArgumentParser(prog="x", formatter_class=DefaultsHelpFormatter)
    p.add_argument("--n", type=int, default=3, help="count")
    p.add_argument("--m", type=int, default=3, help="count (default 3)")
    p.add_argument("--flag", action="store_true", help="switch")
    p.add_argument("--tr", default="nnUNetTrainer", help="trainer of the default model")
    p.add_argument("--size", nargs=2, type=int, default=[4, 5], help="size")
    text = " ".join(p.format_help().split())
    assert "count (default: 3)" in text and "count (default 3)" in text and "(default 3) (default" not in text
    assert "trainer of the default model (default: nnUNetTrainer)" in text
    assert "switch (default: off)" in text and "size (default: 4 5)" in text
