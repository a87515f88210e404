"""Where the tests find the real datasets: the folder named by ``NNUNETV2_MEDDISSEG_TEST_DATA``.

That folder holds ``Kvasir-SEG/`` and ``Kvasir-Sessile/`` in their published layouts (``images/``,
``masks/``). Tests that read it carry the ``real_data`` marker; without the variable they are skipped
(``tests/conftest.py``), with it set to a folder that lacks a dataset they fail.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV_VAR = "NNUNETV2_MEDDISSEG_TEST_DATA"
SKIP_REASON = (f"real data: set {ENV_VAR} to a folder holding Kvasir-SEG/ and Kvasir-Sessile/ "
               f"(their published layouts) to run this test")


def data_root() -> Path | None:
    """The folder named by ``NNUNETV2_MEDDISSEG_TEST_DATA``, or None where the variable is unset or empty."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value) if value else None


def real_dataset(name: str) -> Path:
    """``$NNUNETV2_MEDDISSEG_TEST_DATA/<name>``: skips the test without the variable, fails the test
    where the variable is set but the dataset (its ``images/`` folder) is not there."""
    root = data_root()
    if root is None:
        pytest.skip(SKIP_REASON)
    folder = root / name
    if not (folder / "images").is_dir():
        pytest.fail(f"{ENV_VAR}={root}: {folder / 'images'} not found (expected {name}/ in its published layout)")
    return folder
