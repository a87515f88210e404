"""nnU-Net finds our trainers through nnUNet_extTrainer, and that folder holds only thin imports."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from nnunetv2_meddisseg.trainer_path import TRAINER_FOLDER, trainer_folder
from nnunetv2_meddisseg.training import nnUNetTrainerDispersive as dispersive_module
from nnunetv2_meddisseg.training import scratch_variants, variants
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

SCRATCH_TRAINERS = [name for name in scratch_variants.__all__ if name.startswith("nnUNetTrainer")]
TRAINERS = ["nnUNetTrainerMedDisSeg", *variants.__all__, *dispersive_module.__all__, *SCRATCH_TRAINERS]


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
    assert found in (getattr(variants, name, None), getattr(dispersive_module, name, None),
                     getattr(scratch_variants, name, None), nnUNetTrainerMedDisSeg)
    assert found.__module__.startswith("nnunetv2_meddisseg.training.")
