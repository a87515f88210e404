"""Writing files and folders whole: a reader (or a later run) sees the old version or the new, never a part.

Temporaries are fresh hidden siblings ``.<name>.<random>.partial``, made exclusively in the target's folder (one file
system for the rename); no existing path is reused, written through or removed for its name alone. A folder is replaced
in two renames, the old one first into a fresh holder ``.<name>.<random>.old`` (a kill between them leaves it whole
there for ``restore_set_aside``). Holders and temporary folders carry a ``MARKER`` naming target and process; a later
run touches only real folders so marked whose process ended. No torch or package imports: the ONNX predictor uses it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Callable, List, Optional

__all__ = ["MARKER", "is_inside", "temporary_sibling", "write_atomically", "replace_folder", "set_aside",
           "find_set_aside", "restore_set_aside"]

#: the marker file in a holder of a set-aside folder and in a temporary folder
MARKER = ".nnUNetv2_meddisseg_temporary"
#: inside a holder: the set-aside folder, and the same once the new one is in place (only to be removed)
_KEPT, _REMOVING = "kept", "removing"
_WRITTEN_BY = "nnunetv2_meddisseg.files"


def is_inside(path: os.PathLike, folder: os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, symbolic links resolved."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def _default_mode(folder: bool) -> int:
    """The mode a plain ``open`` / ``mkdir`` would give (mkstemp and mkdtemp make theirs private)."""
    mask = os.umask(0o022)  # the only way to read the umask; set back at once
    os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def _mark(folder: Path, target: Path) -> None:
    marker = {"written_by": _WRITTEN_BY, "target": target.name, "host": socket.gethostname(), "pid": os.getpid()}
    with open(folder / MARKER, "x", encoding="utf-8") as f:
        json.dump(marker, f)


def _pid_ended(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process
        return False
    return False


def _abandoned(folder: Path, target: Path) -> bool:
    """A real folder whose marker (a regular file) names ``target`` and an ended process of this host, or this one."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode) or not stat.S_ISREG(os.lstat(folder / MARKER).st_mode):
            return False
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or not isinstance(marker.get("pid"), int):
        return False
    if (marker.get("written_by"), marker.get("target"), marker.get("host")) != (
            _WRITTEN_BY, target.name, socket.gethostname()):
        return False
    return marker["pid"] == os.getpid() or _pid_ended(marker["pid"])


def _abandoned_siblings(target: Path, suffix: str) -> List[Path]:
    """Abandoned holders (``suffix`` ``.old``) or temporary folders (``.partial``) of ``target``, newest first."""
    pattern = re.compile(re.escape(f".{target.name}.") + r"[A-Za-z0-9_]{8}" + re.escape(suffix))
    try:
        entries = [Path(e.path) for e in os.scandir(target.parent) if pattern.fullmatch(e.name)]
    except OSError:
        return []
    found = {}
    for path in entries:
        if _abandoned(path, target):
            with contextlib.suppress(OSError):  # removed meanwhile
                found[path] = os.lstat(path / MARKER).st_mtime_ns
    return sorted(found, key=found.get, reverse=True)


def _remove(path: Path) -> None:
    """Remove ``path`` (a link itself, never what it points to); nothing where it is missing."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _remove_marked(folder: Path) -> None:
    """Remove a holder or temporary folder of ours, its marker last (a kill half-way leaves it still marked)."""
    for entry in os.listdir(folder):
        if entry != MARKER:
            _remove(folder / entry)
    (folder / MARKER).unlink(missing_ok=True)
    folder.rmdir()


def temporary_sibling(target: Path, folder: bool = False) -> Path:
    """A new empty file (``folder``: a folder holding only ``MARKER``) ``.<name>.<random>.partial`` beside ``target``,
    with a plain ``open`` / ``mkdir``'s mode. Temporary folders of ``target`` that ended processes left go first."""
    target = Path(target)
    prefix, suffix = f".{target.name}.", ".partial"
    if folder:
        target.parent.mkdir(parents=True, exist_ok=True)  # a folder's writers make the folders above it
        for leftover in _abandoned_siblings(target, suffix):
            with contextlib.suppress(OSError):
                _remove_marked(leftover)
        path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=target.parent))
        try:
            os.chmod(path, _default_mode(folder=True))
            _mark(path, target)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return path
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
    try:
        os.fchmod(fd, _default_mode(folder=False))
    finally:
        os.close(fd)
    return Path(name)


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(partial)`` fills a fresh temporary sibling, which then replaces ``path`` (a link, not its target)."""
    path = Path(path)
    partial = temporary_sibling(path)
    try:
        write(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def set_aside(target: Path) -> Path:
    """Move ``target`` into a fresh holder ``.<name>.<random>.old`` beside it, marked before the move; returns it."""
    target = Path(target)
    holder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    try:
        _mark(holder, target)
        os.replace(target, holder / _KEPT)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        raise
    return holder


def replace_folder(new: Path, target: Path) -> None:
    """Move ``new`` onto ``target``; an old ``target`` is set aside meanwhile (put back on failure), then removed."""
    new, target = Path(new), Path(target)
    (new / MARKER).unlink(missing_ok=True)
    if not os.path.lexists(target):
        os.replace(new, target)
        return
    holder = set_aside(target)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(holder / _KEPT, target)
        _remove_marked(holder)
        raise
    # renamed first, so that a kill while it is removed never leaves it to be put back half removed
    os.replace(holder / _KEPT, holder / _REMOVING)
    with contextlib.suppress(OSError):
        _remove_marked(holder)


def find_set_aside(target: Path) -> Optional[Path]:
    """The folder a killed ``replace_folder`` set aside from ``target`` (the newest of several), or None."""
    for holder in _abandoned_siblings(Path(target), ".old"):
        kept = holder / _KEPT
        if kept.is_dir() and not kept.is_symlink():
            return kept
    return None


def restore_set_aside(target: Path) -> bool:
    """Finish a killed ``replace_folder``: put ``target``'s set-aside copy (whole, only renamed) back where it is
    missing, else remove its holders; look-alike folders stay. Returns whether a folder was put back."""
    target = Path(target)
    put_back = False
    for holder in _abandoned_siblings(target, ".old"):
        kept = holder / _KEPT
        if not os.path.lexists(target) and kept.is_dir() and not kept.is_symlink():
            os.replace(kept, target)
            put_back = True
        with contextlib.suppress(OSError):
            _remove_marked(holder)
    return put_back
