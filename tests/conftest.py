"""Fixtures shared by the test tree (temporary nnU-Net folders, a preprocessed tiny dataset) and the
test layers: every test under ``tests/e2e`` and ``tests/compile`` is marked ``e2e`` (the layer the quick
loop ``-m "not e2e"`` leaves out), and so is every test that uses ``preprocessed_synthetic`` (nnU-Net's
preprocessing); elsewhere, tests that train the whole network through a trainer or start processes carry
the mark themselves; tests marked ``real_data`` are skipped
unless ``NNUNETV2_MEDDISSEG_TEST_DATA`` is set (``tests/real_data.py``); tests marked ``slow`` only
run with ``-m slow`` or ``NNUNETV2_MEDDISSEG_SLOW_TESTS=1``."""
from __future__ import annotations

import os

# Two pytest workers and their nnU-Net subprocesses each run torch with a thread per core. OpenMP's threads spin
# while they wait by default, so with fewer cores than busy threads every parallel region waits for the
# descheduled one: two trainings side by side measured 12x slower (benchmarks/shared_cpu.py). Set before any test
# module imports torch; the subprocesses inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402
from typing import Dict  # noqa: E402

import pytest  # noqa: E402
from nnunet_cli import nnunet_env, planning_environment, run_cli
from real_data import SKIP_REASON, data_root
from scratch import scratch_folder

from nnunetv2_meddisseg.environment import NNUNET_FOLDERS

#: folders whose every test is in the ``e2e`` layer: nnU-Net's commands in subprocesses, torch.compile
E2E_FOLDERS = tuple(Path(__file__).resolve().parent / name for name in ("e2e", "compile"))


SLOW_VARIABLE = "NNUNETV2_MEDDISSEG_SLOW_TESTS"
SLOW_REASON = f"slow (minutes of CPU): run with -m slow or {SLOW_VARIABLE}=1"


def pytest_collection_modifyitems(config, items):
    skip_real_data = None if data_root() is not None else pytest.mark.skip(reason=SKIP_REASON)
    run_slow = "slow" in (config.getoption("markexpr", "") or "") or os.environ.get(SLOW_VARIABLE) == "1"
    for item in items:
        in_e2e_folder = any(folder in Path(str(item.fspath)).resolve().parents for folder in E2E_FOLDERS)
        preprocesses = "preprocessed_synthetic" in getattr(item, "fixturenames", ())  # nnU-Net's preprocessing
        if in_e2e_folder or preprocesses:
            item.add_marker(pytest.mark.e2e)
        if skip_real_data is not None and item.get_closest_marker("real_data") is not None:
            item.add_marker(skip_real_data)
        if not run_slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason=SLOW_REASON))


@pytest.fixture
def nnunet_dirs(tmp_path, monkeypatch) -> Dict[str, Path]:
    """nnUNet_raw / nnUNet_preprocessed / nnUNet_results in a temporary folder (environment set;
    nnunetv2.paths reads the environment on every access, so setting it here is enough)."""
    dirs = {}
    for name in NNUNET_FOLDERS:
        dirs[name] = tmp_path / "nnunet" / name
        dirs[name].mkdir(parents=True)
        monkeypatch.setenv(name, str(dirs[name]))
    return dirs


@pytest.fixture(scope="session")
def preprocessed_synthetic(request, tmp_path_factory) -> dict:
    """Dataset501 (generated, 12 train / 4 test, 64x64 RGB) planned and preprocessed for 2d with stock
    nnU-Net. Returns the environment dict to run further nnU-Net commands in. Tests must not modify
    the preprocessed data or nnUNetPlans.json; write other plans names / results folders only. Made once per
    run for every module that reads it; modules that train give their runs an nnUNet_results of their own
    (a scratch folder), so that no two modules' model folders collide."""
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    root = scratch_folder(request, tmp_path_factory, "nnunet")
    env = nnunet_env(root)
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=501, num_train=12, num_test=4, size=64, seed=0)
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", "501", "-c", "2d", "-np", "2"], planning_environment(env))
    return env
