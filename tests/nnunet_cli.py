"""Helpers for tests that drive nnU-Net's and our console commands in subprocesses."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nnunetv2_meddisseg.logged_command import console_command
from nnunetv2_meddisseg.nnunet_env import nnunet_environment, planning_environment

BIN = Path(sys.executable).parent

__all__ = ["BIN", "nnunet_env", "planning_environment", "run_cli"]


def nnunet_env(root: Path) -> dict:
    """Environment for nnU-Net commands with all three folders under ``root`` and our trainers findable;
    batches prepared in the training process (``nnUNet_n_proc_DA=0``), no torch.compile."""
    env = nnunet_environment(root)
    env["nnUNet_def_n_proc"] = "2"
    env["nnUNet_n_proc_DA"] = "0"
    env["nnUNet_compile"] = "false"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_cli(args, env: dict, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a console command (found next to this Python) and return the completed process."""
    proc = subprocess.run([console_command(args[0]), *map(str, args[1:])], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc
