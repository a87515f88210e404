"""The ONNX predictor's output folder: what it may write there, and the record of what it wrote.

The predictor never writes into its inputs: ``-o`` may not be the input folder or the model folder (compared after
resolving symbolic links and relative paths) or lie inside either, and no output file (``<case><ending>``, and
``<case>.npz`` with ``--save_probabilities``) may be an input file (by path or, for an existing file reached through
a link, by identity).

An existing output file is replaced only where it is an unchanged earlier output of the predictor, or with
``--overwrite``. What the predictor wrote is recorded per case in :data:`RECORD_FOLDER` inside the output folder, as
nnU-Net keeps its own files there: ``<case>.json`` lists the case's files before they are written (a kill while
writing leaves files that are still recognised) and their sha256 once they are (a file changed since then is no
longer taken for ours). One record per case, so several processes predicting parts of one folder (``-num_parts``
/ ``-part_id``) never write the same record. With ``--continue_prediction`` (nnU-Net's flag), cases whose recorded
outputs are all there and unchanged are skipped.

Each file is written whole into a fresh temporary sibling (``files.write_atomically``: ``.<name>.<random>.partial``,
made exclusively) and renamed into place, so nothing is written through a link of any name. A :data:`RECORD_FOLDER`
that is a symbolic link or not a folder is refused before anything is written.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from nnunetv2_meddisseg.deploy.image_pipeline import write_segmentation
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import is_inside, write_atomically

__all__ = ["RECORD_FOLDER", "check_folders", "PredictionOutput"]

#: the folder of per-case records inside the output folder
RECORD_FOLDER = ".nnUNetv2_meddisseg_predict_onnx"
WRITER = "nnUNetv2_meddisseg_predict_onnx"


def check_folders(input_folder: Path, output_folder: Path, model_folder: Path) -> None:
    """One line where ``output_folder`` is, or lies inside, the input folder or the model folder, or exists and
    is not a folder."""
    output = Path(output_folder).resolve()
    for option, folder, what in (("-i", input_folder, "input"), ("-m", model_folder, "model")):
        resolved = Path(folder).resolve()
        if is_inside(output, resolved):
            where = "is" if output == resolved else "is inside"
            raise UserError(f"-o {output_folder} {where} the {what} folder {option} {folder}: the predictor never "
                            f"writes into its inputs; choose another -o")
    if Path(output_folder).exists() and not Path(output_folder).is_dir():
        raise UserError(f"-o {output_folder}: exists and is not a folder")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _save_probabilities(probabilities: np.ndarray, path: Path) -> None:
    """``probabilities`` into the npz file ``path`` as nnU-Net's ``--save_probabilities`` names them (written
    through a file object: ``np.savez_compressed`` would append ``.npz`` to another file name)."""
    with open(path, "wb") as f:
        np.savez_compressed(f, probabilities=probabilities)


class PredictionOutput:
    """The output folder of one prediction run: each case's files (``<case><ending>``, and ``<case>.npz`` where
    ``save_probabilities``) and their records."""

    def __init__(self, folder: Path, file_ending: str, save_probabilities: bool) -> None:
        self.folder, self.ending, self.save_probabilities = Path(folder), file_ending, save_probabilities
        self.records = self.folder / RECORD_FOLDER

    def files(self, case: str) -> List[Path]:
        names = [f"{case}{self.ending}"] + ([f"{case}.npz"] if self.save_probabilities else [])
        return [self.folder / n for n in names]

    def _check_records(self) -> None:
        """One line where the record folder is a symbolic link or not a folder (the records are never written
        through a link, nor anywhere but in ``-o``)."""
        if self.records.is_symlink() or (self.records.exists() and not self.records.is_dir()):
            what = "a symbolic link" if self.records.is_symlink() else "not a folder"
            raise UserError(f"{self.records} is {what}: {WRITER} keeps its records of what it wrote in this folder of "
                            f"-o; move it away or choose another -o")

    def _record(self, case: str) -> Dict[str, Optional[str]]:
        """``{file name: sha256, or None while being written}`` of ``case``'s record; empty where there is none (or
        it is a link)."""
        path = self.records / f"{case}.json"
        if path.is_symlink():
            return {}
        try:
            record = json.loads(path.read_text())
            files = record["files"]
            if record.get("written_by") == WRITER and isinstance(files, dict):
                return files
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return {}

    def _is_ours(self, path: Path, record: Dict[str, Optional[str]]) -> bool:
        """``path`` (an existing file) is an earlier output: recorded, and unchanged where its write had ended."""
        if path.name not in record or path.is_symlink() or not path.is_file():
            return False
        return record[path.name] is None or record[path.name] == _sha256(path)

    def _done(self, case: str, record: Dict[str, Optional[str]]) -> bool:
        return all(record.get(p.name) is not None and p.is_file() and not p.is_symlink()
                   and record[p.name] == _sha256(p) for p in self.files(case))

    def plan(self, cases: Sequence[str], input_files: Sequence[Path], continue_prediction: bool = False,
             overwrite: bool = False) -> List[str]:
        """The cases of ``cases`` to predict, in order, after checking every output file: none may be an input
        file (``input_files``: every file of the input folder); an existing one must be an earlier output of ours
        unless ``overwrite``. With ``continue_prediction``, cases whose recorded outputs are all there are left
        out. Nothing is written."""
        self._check_records()
        resolved = {Path(f).resolve(): Path(f) for f in input_files}
        identities = {}
        for f in input_files:
            st = os.stat(f)
            identities[(st.st_dev, st.st_ino)] = Path(f)
        todo, foreign = [], []
        for case in cases:
            record = self._record(case)
            for path in self.files(case):
                same = resolved.get(path.resolve())
                if same is None and path.exists():
                    st = os.stat(path)
                    same = identities.get((st.st_dev, st.st_ino))
                if same is not None:
                    raise UserError(f"{path} (the output of case {case}) would overwrite the input file {same}: the "
                                    f"predictor never writes into its inputs; choose another -o")
                if os.path.lexists(path) and not self._is_ours(path, record):
                    foreign.append(path)
            if not (continue_prediction and self._done(case, record)):
                todo.append(case)
        if foreign and not overwrite:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise UserError(f"{foreign[0]}{more} exists and was not written by {WRITER} (or was changed since): pass "
                            f"--overwrite to replace such files, or choose another -o")
        return todo

    def _create(self) -> None:
        """The output folder and its record folder, made with the first case's files (a run refused at its first
        case leaves no folder behind)."""
        try:
            self.records.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot write {self.folder}: {e.strerror or e}") from None
        self._check_records()

    def _write_record(self, case: str, files: Dict[str, Optional[str]]) -> None:
        text = json.dumps({"written_by": WRITER, "case": case, "files": files}, indent=1)
        path = self.records / f"{case}.json"
        self._writing(path, lambda: write_atomically(path, lambda tmp: tmp.write_text(text)))

    @staticmethod
    def _writing(path: Path, write) -> None:
        try:
            write()
        except OSError as e:
            raise UserError(f"cannot write {path}: {e.strerror or e}") from None

    def write(self, case: str, segmentation: np.ndarray, probabilities: Optional[np.ndarray] = None) -> Path:
        """Write ``case``'s mask (1, X, Y) (and ``probabilities`` (K, 1, X, Y) where the run saves them), each
        whole, recorded before and after (files of the case's record that this run does not write stay recorded);
        returns the mask's path."""
        paths = self.files(case)
        self._create()
        previous = self._record(case)
        self._write_record(case, {**previous, **{p.name: None for p in paths}})
        if self.save_probabilities:
            npz = paths[1]
            self._writing(npz, lambda: write_atomically(npz, lambda tmp: _save_probabilities(probabilities, tmp)))
        self._writing(paths[0], lambda: write_segmentation(segmentation, paths[0]))
        self._write_record(case, {**previous, **{p.name: _sha256(p) for p in paths}})
        return paths[0]
