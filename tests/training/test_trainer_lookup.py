"""nnU-Net finds our trainers through nnUNet_extTrainer, and that folder holds only thin imports."""
import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from nnunetv2_meddisseg.trainer_path import TRAINER_FOLDER, trainer_folder


def _package_trainers():
    """Every trainer class the package's ``training`` modules export: {name: class}."""
    import nnunetv2_meddisseg.training as training

    found = {}
    for info in pkgutil.iter_modules(training.__path__):
        module = importlib.import_module(f"{training.__name__}.{info.name}")
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if name.startswith("nnUNetTrainer") and isinstance(obj, type) and obj.__module__ == module.__name__:
                found[name] = obj
    return found


PACKAGE_TRAINERS = _package_trainers()
TRAINERS = sorted(PACKAGE_TRAINERS)


def _exposed(path):
    """The names a trainer-folder module imports."""
    return [alias.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ImportFrom)
            for alias in node.names]


def test_every_trainer_folder_module_is_named_after_a_class_it_exposes():
    assert len(TRAINERS) >= 35 and "nnUNetTrainerMedDisSeg_paper" in TRAINERS
    exposed = set()
    for path in TRAINER_FOLDER.glob("*.py"):
        if path.stem == "__init__":
            continue
        names = _exposed(path)
        assert names == [path.stem] and path.stem in PACKAGE_TRAINERS, f"{path.name} must expose the class {path.stem} only"
        exposed.update(names)
    assert sorted(exposed) == TRAINERS  # every trainer, and nothing else


def test_trainer_path_command_prints_the_folder():
    out = subprocess.run([sys.executable, "-m", "nnunetv2_meddisseg.trainer_path"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == trainer_folder() == str(TRAINER_FOLDER)
    assert Path(out).is_dir()


def test_trainer_folder_modules_only_import_absolutely():
    modules = {p.name for p in TRAINER_FOLDER.glob("*.py")}
    assert {"__init__.py", "nnUNetTrainerDispersive.py", "nnUNetTrainerMedDisSeg.py"} <= modules
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
            assert node.module.startswith("nnunetv2_meddisseg.training.")


@pytest.mark.parametrize("name", TRAINERS)
def test_nnunet_lookup_finds_each_trainer(name, monkeypatch):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    found = recursive_find_trainer_class_by_name(name)
    assert found.__name__ == name
    # the real class from the package, not a copy from a module nnU-Net imported and dropped
    assert found is PACKAGE_TRAINERS[name]
