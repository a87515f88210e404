"""Helpers for tests that drive nnU-Net's and our console commands in subprocesses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nnunetv2_meddisseg.logged_command import console_command
from nnunetv2_meddisseg.environment import nnunet_environment, planning_environment

BIN = Path(sys.executable).parent

__all__ = ["BIN", "nnunet_env", "planning_environment", "run_cli", "run_until"]


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


def run_until(command: list, env: dict, log: Path, done, timeout: float = 900) -> None:
    """Run ``command`` with its output in ``log`` and SIGKILL its process group once ``done`` (a path that must
    exist, or a function that must return true); the command must still be running then."""
    exists = done if callable(done) else done.exists
    with open(log, "w") as f:
        proc = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not exists():
                assert proc.poll() is None, f"ended before {done} was written:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            alive = proc.poll() is None
            if alive:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert alive, f"finished before it could be killed:\n{log.read_text()[-3000:]}"
