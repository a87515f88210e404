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
