"""A user's folder or a symbolic link planted at a name that a command could take for one of its temporary or
set-aside names (``.NAME.partial``, ``.NAME.old``, the predictor's record folder), and a snapshot of a tree that
shows afterwards that neither it nor what the link points to changed."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Sequence

__all__ = ["KINDS", "plant", "snapshot"]

#: what is planted: a user's folder with a file in it, or a link to a folder or file outside the output
KINDS = ("folder", "link")


def plant(path: Path, kind: str, outside: Path, file: bool = False) -> None:
    """At ``path``: a user's folder holding ``notes.txt`` (``kind`` "folder"), or a link to ``outside``
    ("link"), made here: a file of content (``file``) or a folder holding ``notes.txt`` and an
    ``onnx_model.json``."""
    if kind == "folder":
        path.mkdir()
        (path / "notes.txt").write_text("a user's notes")
        return
    assert kind == "link", kind
    if file:
        outside.parent.mkdir(parents=True, exist_ok=True)
        outside.write_bytes(b"a user's file")
    else:
        outside.mkdir(parents=True)
        (outside / "notes.txt").write_text("a user's notes")
        (outside / "onnx_model.json").write_text('{"a user\'s": "description"}')
    path.symlink_to(outside)


def snapshot(root: Path, leave_out: Sequence[Path] = ()) -> Dict[str, object]:
    """Every entry under ``root`` (links not followed) but those in or under ``leave_out``: a file's bytes, a
    link's target, or "folder"."""
    root, left_out = Path(root), {Path(p) for p in leave_out}
    entries: Dict[str, object] = {}
    for folder, folders, files in os.walk(root):
        folders[:] = [f for f in folders if Path(folder, f) not in left_out]
        for name in folders + files:
            path = Path(folder, name)
            if path in left_out:
                continue
            key = path.relative_to(root).as_posix()
            if path.is_symlink():
                entries[key] = f"link to {os.readlink(path)}"
            elif path.is_dir():
                entries[key] = "folder"
            else:
                entries[key] = path.read_bytes()
    return entries
