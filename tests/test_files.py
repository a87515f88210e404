"""``files``: a file or folder is replaced whole or not at all."""
import json
import os
import socket
import stat
from pathlib import Path

import pytest
from planted import KINDS, plant, snapshot

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
    path.mkdir(exist_ok=True)
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


@pytest.mark.parametrize("name", [".plans.json.partial", ".export.partial", ".export.old"])
@pytest.mark.parametrize("kind", KINDS)
def test_no_file_folder_or_link_of_a_fixed_temporary_name_is_used(tmp_path, name, kind):
    """Planted where a fixed temporary or set-aside name would be, a user's folder or link is neither written
    through, moved nor removed; the files and folders are written and replaced all the same."""
    plant(tmp_path / name, kind, tmp_path / "outside", file=name.startswith(".plans"))
    before = snapshot(tmp_path)
    write_atomically(tmp_path / "plans.json", lambda tmp: tmp.write_text("new"))
    target = tmp_path / "export"
    replace_folder(_folder(files.temporary_sibling(target, folder=True), "first"), target)
    replace_folder(_folder(files.temporary_sibling(target, folder=True), "second"), target)
    assert files.restore_set_aside(target) is False and files.find_set_aside(target) is None
    assert (tmp_path / "plans.json").read_text() == "new" and not target.is_symlink()
    assert {p.name: p.read_text() for p in target.iterdir()} == {"a.txt": "second"}  # no marker left in it
    assert snapshot(tmp_path, leave_out=[target, tmp_path / "plans.json"]) == before  # nor any temporary


def _holder_lookalike(tmp_path, how):
    """A folder named as a holder of ``export`` is, with the old folder in it, that is not provably ours."""
    holder = tmp_path / ".export.abcd1234.old"
    (holder / "kept").mkdir(parents=True)
    (holder / "kept" / "a.txt").write_text("mine")
    marker = json.dumps({"written_by": "nnunetv2_meddisseg.files", "target": "export", "host": socket.gethostname(),
                         "pid": os.getppid()})  # a process that is still running
    if how == "no marker":
        return
    if how == "marker of a running process":
        (holder / files.MARKER).write_text(marker)
    elif how == "marker is a link":
        (tmp_path / "elsewhere").write_text(marker.replace(str(os.getppid()), str(os.getpid())))
        (holder / files.MARKER).symlink_to(tmp_path / "elsewhere")
    elif how == "holder is a link":
        os.rename(holder, tmp_path / "real")
        (tmp_path / "real" / files.MARKER).write_text(marker.replace(str(os.getppid()), str(os.getpid())))
        holder.symlink_to(tmp_path / "real")


@pytest.mark.parametrize("how", ["no marker", "marker of a running process", "marker is a link",
                                 "holder is a link"])
def test_a_folder_that_merely_looks_like_a_holder_is_never_moved_or_removed(tmp_path, how):
    _holder_lookalike(tmp_path, how)
    before = snapshot(tmp_path)
    assert files.find_set_aside(tmp_path / "export") is None
    assert files.restore_set_aside(tmp_path / "export") is False and snapshot(tmp_path) == before
    target = _folder(tmp_path / "export", "old")
    replace_folder(_folder(files.temporary_sibling(target, folder=True), "new"), target)
    assert files.restore_set_aside(target) is False and (target / "a.txt").read_text() == "new"
    assert snapshot(tmp_path, leave_out=[target]) == before


KILLED_WRITER = '''import sys
from pathlib import Path
from nnunetv2_meddisseg import files

partial = files.temporary_sibling(Path(sys.argv[1]), folder=True)
(partial / "a.txt").write_text("half")
print(partial)
'''


def test_a_temporary_folder_a_finished_process_left_is_removed_by_the_next_one(tmp_path):
    import subprocess
    import sys

    target = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(target)], capture_output=True, text=True,
                          timeout=120, check=True)
    left = Path(proc.stdout.strip())
    assert left.parent == tmp_path and (left / "a.txt").read_text() == "half"
    _holder_lookalike(tmp_path, "no marker")
    (tmp_path / ".export.partial").mkdir()  # a user's, of the old fixed name
    before = snapshot(tmp_path, leave_out=[left])
    partial = files.temporary_sibling(target, folder=True)
    assert not left.exists() and partial.is_dir() and snapshot(tmp_path, leave_out=[partial]) == before


def test_temporaries_get_the_mode_of_a_plain_write(tmp_path):
    mask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "plans.json", lambda tmp: tmp.write_text("new"))
        partial = files.temporary_sibling(tmp_path / "export", folder=True)
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "plans.json").stat().st_mode) == 0o640
    assert stat.S_IMODE(partial.stat().st_mode) == 0o750
