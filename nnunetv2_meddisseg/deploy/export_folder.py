"""Where ``nnUNetv2_meddisseg_export`` may write (its ``-o``), checked before the export starts, and writing there
whole.

``-o`` may name a folder that does not exist yet, an empty folder, or an earlier export: a folder whose
``onnx_model.json`` says the export wrote it (``deploy.description.written_by_export``) and that holds nothing
besides it and its ``fold_*`` folders. Anything else that exists (a file, a folder of other files, the trained model
folder) is refused, and so is any ``-o`` inside nnU-Net's folders (``nnUNet_raw``, ``nnUNet_preprocessed``,
``nnUNet_results``), which belong to nnU-Net, except the default: ``onnx`` inside the exported model's folder.

The folder is written into a hidden sibling and moved over ``-o`` (``files.replace_folder``); an export that a kill
left set aside there is put back first (``files.restore_set_aside``), so that a kill at any moment leaves the old or
the new export whole.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict

from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, WRITTEN_BY, fold_model_file, written_by_export
from nnunetv2_meddisseg.environment import NNUNET_FOLDERS
from nnunetv2_meddisseg.files import replace_folder, restore_set_aside, set_aside_path

__all__ = ["DEFAULT_NAME", "check_output", "write_export"]

#: the default output: this folder inside the model folder
DEFAULT_NAME = "onnx"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _refuse_nnunet_folders(output: Path, resolved: Path, model_folder: Path) -> None:
    default = (model_folder / DEFAULT_NAME).resolve()
    if resolved == default:
        return
    if _inside(resolved, model_folder.resolve()):
        raise UserError(f"-o {output} is inside the model folder {model_folder}: the export goes there only to its "
                        f"default place {default} (leave -o out), or to a folder outside nnU-Net's folders")
    for name in NNUNET_FOLDERS:
        root = os.environ.get(name)
        if root and _inside(resolved, Path(root).resolve()):
            raise UserError(f"-o {output} is inside {name} ({root}), whose folders belong to nnU-Net: choose a folder "
                            f"outside nnU-Net's folders, or leave -o out for the default {default}")


def _written_by_export(folder: Path) -> bool:
    """``folder`` holds an ``onnx_model.json`` that the export wrote."""
    description = folder / DESCRIPTION_FILE
    try:
        return description.is_file() and written_by_export(json.loads(description.read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def _refuse_what_is_not_an_export(output: Path) -> None:
    """An existing ``output`` passes when it is an empty folder or an earlier export holding only what the export
    writes."""
    if not output.is_dir():
        raise UserError(f"-o {output} exists and is not a folder: the export writes a folder; choose a new name")
    entries = sorted(output.iterdir())
    if not entries:
        return
    if not _written_by_export(output):
        raise UserError(f"-o {output} exists and is not an export of {WRITTEN_BY} (no {DESCRIPTION_FILE} written "
                        f"by it): -o replaces only an earlier export; choose a new folder")
    other = [e.name for e in entries
             if e.name != DESCRIPTION_FILE and not (e.name.startswith("fold_") and e.is_dir() and not e.is_symlink())]
    if other:
        raise UserError(f"-o {output} is an earlier export but also holds {', '.join(other[:3])}"
                        f"{' ...' if len(other) > 3 else ''}, which the export did not write: move them out or "
                        f"choose a new folder")


def _refuse_unwritable(output: Path) -> None:
    """One line where nothing can be created beside ``output`` (its nearest existing parent folder)."""
    parent = output.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"cannot write {output}: {parent} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".nnUNetv2_meddisseg_export.", dir=parent))
    except OSError as e:
        raise UserError(f"cannot write {output}: {e.strerror or e}") from None


def check_output(output: Path, model_folder: Path) -> Path:
    """``output`` (the command's ``-o``, or :data:`DEFAULT_NAME` in ``model_folder``) as an absolute path, after
    putting back an earlier export that a killed export left aside there; one line where the export may not write
    it (module docstring) or cannot."""
    output = Path(os.path.abspath(output))
    if output.is_symlink():
        raise UserError(f"-o {output} is a symbolic link: name the folder itself")
    _refuse_nnunet_folders(output, output.resolve(), Path(model_folder))
    if _written_by_export(set_aside_path(output)) and restore_set_aside(output):
        print(f"{output}: put back the earlier export that an interrupted export had set aside")
    if output.exists():
        _refuse_what_is_not_an_export(output)
    _refuse_unwritable(output)
    return output


def write_export(output: Path, models: Dict[str, bytes], description: dict) -> None:
    """Write the folder whole: each fold's graph (``models``: fold -> ONNX bytes) and ``description`` into a hidden
    sibling first, then moved over ``output``; an OS error (a full disk, no permission) is one line and leaves
    ``output`` as it was."""
    partial = output.with_name(f".{output.name}.partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        for fold, model in models.items():
            target = partial / fold_model_file(fold)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(model)
        (partial / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2))
        replace_folder(partial, output)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        raise UserError(f"cannot write {output}: {e.strerror or e}") from None
