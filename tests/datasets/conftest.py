"""Fixtures of the converter tests."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest


@pytest.fixture
def nnunet_dirs(tmp_path, monkeypatch) -> Dict[str, Path]:
    """nnUNet_raw / nnUNet_preprocessed / nnUNet_results in a temporary folder (environment set)."""
    dirs = {}
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        dirs[name] = tmp_path / "nnunet" / name
        dirs[name].mkdir(parents=True)
        monkeypatch.setenv(name, str(dirs[name]))
    return dirs
