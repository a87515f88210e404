"""Writing files and folders whole: a reader (or a later run) sees the old version or the new one, never a part.

Both helpers write beside the target (a hidden sibling in the same folder, so the final rename stays on one file
system) and rename into place. They import nothing of the package and no torch: the ONNX predictor, which runs
without PyTorch, uses them too.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

__all__ = ["write_atomically", "replace_folder"]


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


def replace_folder(new: Path, target: Path) -> None:
    """Move the complete folder ``new`` to ``target``. An existing ``target`` is set aside as ``.<name>.old``
    until the new folder is in place (and put back where that move fails), then removed."""
    new, target = Path(new), Path(target)
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
