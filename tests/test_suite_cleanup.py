"""The test suite cleans up after itself: what this repository's ``pytest.ini`` and ``scratch_folder``
(tests/scratch.py) leave in pytest's temporary root, seen through small pytest runs in subprocesses.

Each run gets its own temporary root (``PYTEST_DEBUG_TEMPROOT``), so the runs here never touch the
folders of the run that executes this file.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

FIXTURE_MODULE = f'''
import sys
from pathlib import Path

import pytest

sys.path.insert(0, {str(TESTS)!r})
from scratch import scratch_folder

RECORD = Path(__file__).parent / "folders.txt"


def record(folder):
    with open(RECORD, "a") as f:
        f.write(f"{{folder}}\\n")


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    folder = scratch_folder(request, tmp_path_factory, "training")
    (folder / "checkpoint_final.pth").write_bytes(bytes(100_000))
    record(folder)
    return folder


def test_reads_the_module_folder(trained):
    assert (trained / "checkpoint_final.pth").is_file()


def test_writes_its_own_folder(tmp_path, trained):
    (tmp_path / "prediction.png").write_bytes(bytes(1000))
    record(tmp_path)
    assert FAIL is False
'''

LATER_MODULE = '''
from pathlib import Path

RECORD = Path(__file__).parent / "folders.txt"


def test_the_earlier_module_folder_is_gone_before_the_run_ends():
    training = [Path(line) for line in RECORD.read_text().splitlines() if Path(line).name.startswith("training")]
    assert len(training) == 1
    assert not training[0].exists(), f"{training[0]} still exists after the last test that used it"
'''


def _run_pytest(project: Path, temproot: Path, fail: bool) -> subprocess.CompletedProcess:
    """pytest with this repository's pytest.ini on ``project`` (test_a.py, then test_b.py unless ``fail``)."""
    (project / "test_a.py").write_text(FIXTURE_MODULE + f"\n\nFAIL = {fail}\n")
    if not fail:
        (project / "test_b.py").write_text(LATER_MODULE)
    elif (project / "test_b.py").exists():
        (project / "test_b.py").unlink()
    (project / "folders.txt").write_text("")
    env = {**os.environ, "PYTEST_DEBUG_TEMPROOT": str(temproot)}
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pytest.ini"), "--rootdir", str(project),
                           "-p", "no:cacheprovider", "-q", str(project)], env=env, capture_output=True, text=True,
                          timeout=300)


def _left_behind(temproot: Path) -> list:
    """Files (not folders, locks or links) under the temporary root."""
    return sorted(str(p.relative_to(temproot)) for p in temproot.rglob("*")
                  if p.is_file() and not p.is_symlink() and p.name != ".lock")


def test_a_passing_run_leaves_nothing_and_module_folders_go_after_their_last_test(tmp_path):
    project, temproot = tmp_path / "project", tmp_path / "temproot"
    project.mkdir()
    temproot.mkdir()
    proc = _run_pytest(project, temproot, fail=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "3 passed" in proc.stdout
    assert _left_behind(temproot) == [], "a passing run left files in pytest's temporary root"


def test_only_the_last_failing_run_keeps_its_folders(tmp_path):
    """A failing run keeps the folders of its failed test and of that test's module for inspection; a
    passing run deletes only its own; the next failing run deletes the earlier one's."""
    project, temproot = tmp_path / "project", tmp_path / "temproot"
    project.mkdir()
    temproot.mkdir()
    kept = []  # per run: its recorded folders that exist once it has ended
    for fail in (True, False, True):
        proc = _run_pytest(project, temproot, fail=fail)
        assert proc.returncode == (1 if fail else 0), proc.stdout[-3000:]
        recorded = [Path(line) for line in (project / "folders.txt").read_text().splitlines()]
        assert len(recorded) == 2  # the module's folder and the second test's
        kept.append([f for f in recorded if f.exists()])
        if kept[-1]:
            assert (kept[-1][0] / "checkpoint_final.pth").is_file() and (kept[-1][1] / "prediction.png").is_file()
            (kept[-1][0] / f"written_by_run_{len(kept)}").touch()
    assert [len(k) for k in kept] == [2, 0, 2]
    markers = list(temproot.rglob("written_by_run_*"))
    assert [m.name for m in markers] == ["written_by_run_3"]  # the first failing run's folders are gone
    assert {Path(f).parts[:2] for f in _left_behind(temproot)} == {kept[2][0].relative_to(temproot).parts[:2]}


def test_fixtures_take_their_folders_from_scratch_folder():
    """tmp_path_factory.mktemp's folders outlive their tests; only scratch_folder may call it."""
    callers = [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
               if p.name != "scratch.py" and p != Path(__file__).resolve()
               and re.search(r"\.mktemp\(", p.read_text(encoding="utf-8"))]
    assert callers == [], f"use scratch.scratch_folder instead of tmp_path_factory.mktemp in {callers}"
