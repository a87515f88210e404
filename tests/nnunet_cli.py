"""Helpers for tests that drive nnU-Net's and our console commands in subprocesses."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from nnunetv2_meddisseg.environment import nnunet_environment, planning_environment
from nnunetv2_meddisseg.logged_command import console_command

BIN = Path(sys.executable).parent

__all__ = ["BIN", "fake_kvasir", "nnunet_env", "planning_environment", "run_cli", "run_until"]


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


def fake_kvasir(root: Path, counts: Sequence[int]) -> Path:
    """Polyp-like discs on noise (48 x 56), as JPEGs named as the first TRAIN / VAL / TEST cases (``counts``) of
    the shipped Kvasir-SEG split, in ``root/images`` and ``root/masks``."""
    import nnunetv2_meddisseg.datasets as datasets

    shipped = json.loads((Path(datasets.__file__).parent / "splits" / "kvasir_seg.json").read_text())
    rng = np.random.default_rng(0)
    for sub in ("images", "masks"):
        (root / sub).mkdir(parents=True)
    yy, xx = np.mgrid[:48, :56]
    names = [name for part, n in zip(("train", "val", "test"), counts) for name in shipped[part][:n]]
    for name in names:
        cy, cx, r = rng.integers(14, 34), rng.integers(14, 42), rng.integers(6, 12)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
        image = rng.integers(20, 90, (48, 56, 3)).astype(np.uint8)
        image[disc] = (200, 120, 110)
        Image.fromarray(image).save(root / "images" / f"{name}.jpg", quality=95)
        Image.fromarray((disc * 255).astype(np.uint8)).save(root / "masks" / f"{name}.jpg", quality=95)
    return root
