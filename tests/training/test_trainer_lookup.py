"""nnU-Net finds our trainers through nnUNet_extTrainer, and that folder holds one module of thin imports."""
import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from nnunetv2_meddisseg.environment import TRAINER_FOLDER, trainer_folder
from nnunetv2_meddisseg.trainer_path import catalogue


def _package_trainers():
    """Every trainer class the package's ``training`` and ``ablation`` modules define and export: {name: class}."""
    import nnunetv2_meddisseg.ablation as ablation
    import nnunetv2_meddisseg.training as training

    found = {}
    for package in (training, ablation):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name in getattr(module, "__all__", ()):
                obj = getattr(module, name)
                if name.startswith("nnUNetTrainer") and isinstance(obj, type) and obj.__module__ == module.__name__:
                    found[name] = obj
    return found


PACKAGE_TRAINERS = _package_trainers()
TRAINERS = sorted(PACKAGE_TRAINERS)


def test_the_trainer_folder_module_exposes_every_trainer_and_nothing_else():
    from nnunetv2_meddisseg.nnunet_trainers import meddisseg_trainers

    assert len(TRAINERS) >= 35 and "nnUNetTrainerMedDisSeg_paper" in TRAINERS
    assert sorted(p.name for p in TRAINER_FOLDER.glob("*.py")) == ["__init__.py", "meddisseg_trainers.py"]
    assert sorted(meddisseg_trainers.__all__) == TRAINERS  # every trainer, and nothing else
    for name in meddisseg_trainers.__all__:
        assert getattr(meddisseg_trainers, name) is PACKAGE_TRAINERS[name]


def test_trainer_path_lists_the_catalogue_one_line_each():
    out = subprocess.run([sys.executable, "-m", "nnunetv2_meddisseg.trainer_path", "--list"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    assert [line.split(":")[0] for line in out] == list(catalogue())
    assert sorted(catalogue()) == TRAINERS and out[0].startswith("nnUNetTrainerMedDisSeg: Med-DisSeg")
    assert all(len(line.split(": ", 1)[1]) > 10 and "\n" not in line for line in out)
    assert "nnUNetTrainerMedDisSeg_tau0p5: ablation: temperature 0.5 (default 0.8)" in out


def test_trainer_path_command_prints_the_folder():
    out = subprocess.run([sys.executable, "-m", "nnunetv2_meddisseg.trainer_path"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == trainer_folder() == str(TRAINER_FOLDER)
    assert Path(out).is_dir()


def test_trainer_folder_modules_only_import_absolutely():
    assert not [p for p in TRAINER_FOLDER.iterdir() if p.is_dir() and p.name != "__pycache__"]
    stdlib = set(sys.stdlib_module_names)
    for path in TRAINER_FOLDER.glob("*.py"):
        # nnU-Net puts this folder first on sys.path while importing: no name may shadow a real module
        assert path.stem == "__init__" or path.stem not in stdlib
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Expr, ast.Assign)):  # docstring, __all__
                continue
            assert isinstance(node, ast.ImportFrom) and node.level == 0, f"{path.name}: only absolute imports"
            # nnU-Net drops the modules of this folder after a search: import nothing from it
            assert node.module.startswith("nnunetv2_meddisseg.") and "nnunet_trainers" not in node.module


@pytest.mark.parametrize("name", TRAINERS)
def test_nnunet_lookup_finds_each_trainer(name, monkeypatch):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    found = recursive_find_trainer_class_by_name(name)
    assert found.__name__ == name
    # the real class from the package, not a copy from a module nnU-Net imported and dropped
    assert found is PACKAGE_TRAINERS[name]
