"""``files``: a file or folder is replaced whole or not at all."""
import os

import pytest

from nnunetv2_meddisseg import files
from nnunetv2_meddisseg.files import replace_folder, write_atomically


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path):
    target = tmp_path / "plans.json"
    write_atomically(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new"

    def fails_halfway(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, fails_halfway)
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["plans.json"]


def _folder(path, text):
    path.mkdir()
    (path / "a.txt").write_text(text)
    return path


def test_a_folder_is_replaced_whole_and_put_back_where_the_move_fails(tmp_path, monkeypatch):
    target = tmp_path / "export"
    replace_folder(_folder(tmp_path / ".export.partial", "first"), target)
    assert (target / "a.txt").read_text() == "first"
    replace_folder(_folder(tmp_path / ".export.partial", "second"), target)
    assert (target / "a.txt").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # neither the partial nor the old folder left

    real, calls = os.replace, []

    def second_move_fails(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the new folder onto the target, after the old one was set aside
            raise OSError("no space")
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", second_move_fails)
    with pytest.raises(OSError, match="no space"):
        replace_folder(_folder(tmp_path / ".export.partial", "third"), target)
    assert (target / "a.txt").read_text() == "second"  # the previous folder is back


KILLED_REPLACE = '''import os, shutil, signal, sys
from nnunetv2_meddisseg import files

point, new, target = sys.argv[1], sys.argv[2], sys.argv[3]
real_replace, real_rmtree, calls = os.replace, shutil.rmtree, []


def replace(src, dst):
    calls.append(dst)
    if point == f"rename {len(calls)}":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)


def rmtree(path, ignore_errors=False):
    if point == "removing the old folder":
        os.remove(os.path.join(path, "a.txt"))  # half removed
        os.kill(os.getpid(), signal.SIGKILL)
    real_rmtree(path, ignore_errors=ignore_errors)


files.os.replace, files.shutil.rmtree = replace, rmtree
files.replace_folder(new, target)
'''


@pytest.mark.parametrize("point", ["rename 1", "rename 2", "removing the old folder"])
def test_a_kill_at_any_moment_leaves_one_folder_whole_and_the_next_run_finds_it(tmp_path, point):
    import signal
    import subprocess
    import sys

    target = tmp_path / "export"
    _folder(target, "old")
    (target / "b.txt").write_text("old")
    new = _folder(tmp_path / ".export.partial", "new")
    (new / "b.txt").write_text("new")
    proc = subprocess.run([sys.executable, "-c", KILLED_REPLACE, point, str(new), str(target)], timeout=120)
    assert proc.returncode == -signal.SIGKILL  # killed where the point says
    if point == "rename 2":  # between the renames: the target is missing, the old folder whole beside it
        assert not target.exists() and files.find_set_aside(target).is_dir()
    put_back = files.restore_set_aside(target)
    assert put_back == (point == "rename 2")
    texts = {p.name: p.read_text() for p in target.iterdir()}
    expected = "new" if point == "removing the old folder" else "old"
    assert texts == {"a.txt": expected, "b.txt": expected}  # one whole folder, never a mixture
    assert files.find_set_aside(target) is None
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".old")] == []  # no holder left
    assert files.restore_set_aside(target) is False  # nothing left to do
