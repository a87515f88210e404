"""Folders for what module- and session-scoped fixtures write (training runs, preprocessed data, weights).

pytest deletes a passing test's ``tmp_path`` when the test ends (``tmp_path_retention_policy = failed`` in
``pytest.ini``), but the folders of ``tmp_path_factory.mktemp`` live until the end of the run, so a run's
disk use would grow with every end-to-end module. Fixtures take their folders from :func:`scratch_folder`
instead, which deletes them as soon as the fixture is torn down (after the last test that used it), unless
a test failed meanwhile: then, like a failed test's ``tmp_path``, the folder stays for inspection until
the next run (``tmp_path_retention_count = 1``).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

__all__ = ["scratch_folder"]


def scratch_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A new folder ``<basetemp>/<name>N`` for the fixture of ``request``, deleted at its teardown if no
    test failed between its creation and the teardown."""
    folder = tmp_path_factory.mktemp(name)
    failed_before = request.session.testsfailed

    def remove() -> None:
        if request.session.testsfailed == failed_before:
            shutil.rmtree(folder, ignore_errors=True)

    request.addfinalizer(remove)
    return folder
