"""Fixtures shared by the test tree: nnU-Net folders in a temporary place, a preprocessed tiny dataset."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def preprocessed_synthetic(tmp_path_factory) -> dict:
    """Dataset501 (generated, 12 train / 4 test, 64x64 RGB) planned and preprocessed for 2d with stock
    nnU-Net. Returns the environment dict to run further nnU-Net commands in. Tests must not modify
    the preprocessed data or nnUNetPlans.json; write other plans names / results folders only."""
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    root = tmp_path_factory.mktemp("nnunet")
    env = nnunet_env(root)
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=501, num_train=12, num_test=4, size=64, seed=0)
    plan_env = {k: v for k, v in env.items() if k != "nnUNet_n_proc_DA"}  # 0 breaks nnU-Net's VRAM estimate
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", "501", "-c", "2d", "-np", "2"], plan_env)
    return env
