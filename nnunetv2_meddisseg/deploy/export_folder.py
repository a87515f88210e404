"""Where ``nnUNetv2_meddisseg_export`` may write (its ``-o``), checked before the export, and writing there whole.

``-o`` may be a new or empty folder, or an earlier export holding only the files its ``onnx_model.json`` records.
Anything else is refused, and so is any ``-o`` inside nnU-Net's folders (``nnUNet_raw``, ``nnUNet_preprocessed``,
``nnUNet_results``) except the default, ``onnx`` in the model's folder.

The folder is written into a hidden sibling ``.NAME.<random>.partial`` and moved over ``-o``, the earlier export set
aside as ``.NAME.<random>.old`` until then; one a kill left aside is put back first, so a kill at any moment leaves
the old or the new export whole. A user's file, folder or link of such a name is never written through, moved or
removed.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Dict, Optional, Set

from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, WRITTEN_BY, fold_model_file
from nnunetv2_meddisseg.environment import NNUNET_FOLDERS
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import is_inside, replace_folder, restore_set_aside, temporary_sibling

__all__ = ["DEFAULT_NAME", "check_output", "write_export"]

#: the default output: this folder inside the model folder
DEFAULT_NAME = "onnx"


def _refuse_nnunet_folders(output: Path, resolved: Path, model_folder: Path) -> None:
    default = (model_folder / DEFAULT_NAME).resolve()
    if resolved == default:
        return
    if is_inside(resolved, model_folder):
        raise UserError(f"-o {output} is inside the model folder {model_folder}: the export goes there only to its "
                        f"default place {default} (leave -o out), or to a folder outside nnU-Net's folders")
    for name in NNUNET_FOLDERS:
        root = os.environ.get(name)
        if root and is_inside(resolved, root):
            raise UserError(f"-o {output} is inside {name} ({root}), whose folders belong to nnU-Net: choose a folder "
                            f"outside nnU-Net's folders, or leave -o out for the default {default}")


def _recorded_files(description: dict) -> Set[str]:
    """The files an export's description records, relative to the folder; malformed entries are left out."""
    recorded = {DESCRIPTION_FILE}
    for fold in description.get("folds") if isinstance(description.get("folds"), list) else []:
        if not isinstance(fold, dict):
            continue
        if isinstance(fold.get("file"), str):
            recorded.add(fold["file"])
        records = fold.get("precisions") if isinstance(fold.get("precisions"), dict) else {}
        for record in records.values():
            files = record.get("files") if isinstance(record, dict) else None
            recorded.update(name for name in files or {} if isinstance(name, str))
    return recorded


def _refuse_what_is_not_an_export(output: Path) -> None:
    """Refuse an existing ``output`` unless empty or an earlier export holding only its recorded files and folders."""
    if not output.is_dir():
        raise UserError(f"-o {output} exists and is not a folder: the export writes a folder; choose a new name")
    if not any(output.iterdir()):
        return
    try:
        description = json.loads((output / DESCRIPTION_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        description = None
    if not (isinstance(description, dict) and description.get("written_by") == WRITTEN_BY):
        raise UserError(f"-o {output} exists and is not an export of {WRITTEN_BY} (no {DESCRIPTION_FILE} written "
                        f"by it): -o replaces only an earlier export; choose a new folder")
    recorded = _recorded_files(description)
    folders = {parent.as_posix() for name in recorded for parent in PurePosixPath(name).parents}
    other = [name for name, path in ((p.relative_to(output).as_posix(), p) for p in sorted(output.rglob("*")))
             if path.is_symlink() or name not in (folders if path.is_dir() else recorded)]
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
    """``output`` made absolute, an export a kill set aside there put back; one line where it may not be written."""
    output = Path(os.path.abspath(output))
    if output.is_symlink():
        raise UserError(f"-o {output} is a symbolic link: name the folder itself")
    _refuse_nnunet_folders(output, output.resolve(), Path(model_folder))
    if restore_set_aside(output):
        print(f"{output}: put back the earlier export that an interrupted export had set aside")
    if output.exists():
        _refuse_what_is_not_an_export(output)
    _refuse_unwritable(output)
    return output


def write_export(output: Path, models: Dict[str, bytes], description: dict,
                 extra: Optional[Dict[str, bytes]] = None) -> None:
    """Write ``models`` (fold -> ONNX bytes), ``extra`` (path in a ``fold_*`` folder -> bytes) and ``description``
    into a hidden sibling, then move it over ``output``; an OS error is one line and leaves ``output`` as it was."""
    files = {fold_model_file(fold): model for fold, model in models.items()}
    files.update(extra or {})
    outside = [name for name in files if not name.startswith("fold_") or "/" not in name]
    if outside:
        raise ValueError(f"export files outside the fold folders: {outside}")
    partial = None
    try:
        partial = temporary_sibling(output, folder=True)
        for name, content in files.items():
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        (partial / DESCRIPTION_FILE).write_text(json.dumps(description, indent=2))
        replace_folder(partial, output)
    except OSError as e:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise UserError(f"cannot write {output}: {e.strerror or e}") from None
