"""Writing files and folders whole: a reader (or a later run) sees the old version or the new one, never a part.

Both helpers write beside the target (a hidden sibling in the same folder, so the final rename stays on one file
system) and rename into place. A folder is replaced in two renames (the old one set aside as ``.<name>.old``, the
new one moved in); a process killed between them leaves the target missing and the old folder whole beside it,
which :func:`restore_set_aside` puts back. They import nothing of the package and no torch: the ONNX predictor,
which runs without PyTorch, uses them too.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

__all__ = ["is_inside", "write_atomically", "replace_folder", "set_aside_path", "restore_set_aside"]


def is_inside(path: os.PathLike, folder: os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, symbolic links resolved (where a command's output would
    land in one of its inputs)."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(partial)`` writes the whole file to the hidden sibling ``.<name>.partial``, which then replaces
    ``path`` (``os.replace``); where ``write`` fails, the partial file is removed and the error raised."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def set_aside_path(target: Path) -> Path:
    """Where :func:`replace_folder` keeps the old ``target`` until the new one is in place: ``.<name>.old``."""
    target = Path(target)
    return target.with_name(f".{target.name}.old")


def replace_folder(new: Path, target: Path) -> None:
    """Move the complete folder ``new`` to ``target``. An existing ``target`` is set aside as ``.<name>.old``
    until the new folder is in place (and put back where that move fails), then removed."""
    new, target = Path(new), Path(target)
    if not target.exists():
        os.replace(new, target)
        return
    old = set_aside_path(target)
    if old.exists():
        shutil.rmtree(old)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def restore_set_aside(target: Path) -> bool:
    """Finish what a killed :func:`replace_folder` left: where ``target`` is missing and its set-aside copy
    exists (killed between the two renames), that copy, whole since it was only renamed, is moved back; where
    both exist (killed after the new folder was in place, maybe while the old one was being removed), the
    set-aside copy is removed. Returns whether a folder was put back."""
    target = Path(target)
    old = set_aside_path(target)
    if not old.is_dir() or old.is_symlink():
        return False
    if os.path.lexists(target):
        shutil.rmtree(old, ignore_errors=True)
        return False
    os.replace(old, target)
    return True
