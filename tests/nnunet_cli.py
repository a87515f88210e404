"""Helpers for tests that drive nnU-Net's and our console commands in subprocesses."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent


def nnunet_env(root: Path) -> dict:
    """Environment for nnU-Net commands with all three folders under ``root`` and our trainers findable."""
    env = dict(os.environ)
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        (root / name).mkdir(parents=True, exist_ok=True)
        env[name] = str(root / name)
    env["nnUNet_extTrainer"] = str(REPO_ROOT / "nnunetv2_meddisseg" / "nnunet_trainers")
    env["nnUNet_def_n_proc"] = "2"
    env["nnUNet_n_proc_DA"] = "0"
    env["nnUNet_compile"] = "false"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_cli(args, env: dict, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a console command (found next to this Python) and return the completed process."""
    proc = subprocess.run([str(BIN / args[0]), *map(str, args[1:])], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return proc


