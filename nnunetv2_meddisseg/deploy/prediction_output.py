"""The ONNX predictor's output folder: what it may write there, and the record of what it wrote.

The predictor never writes into its inputs: ``-o`` may not be or lie inside the input or model folder, and no
output file may be an input file, by resolved path or by identity.

An existing output is replaced only if it is an unchanged earlier output, or with ``--overwrite``. Each case's
``RECORD_FOLDER/<case>.json`` lists its files before they are written (so a kill mid-write leaves them recognised)
and their sha256 after (a file changed since is no longer ours); one record per case, so ``-num_parts`` processes
never write the same one. Each file is written whole into a fresh ``.<name>.<random>.partial`` sibling and renamed
into place, so nothing is written through a link.
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
    """Refuse an ``output_folder`` that is or lies inside the input or model folder, or exists and is not a folder."""
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
    """``probabilities`` into ``path`` as nnU-Net names them, via a file object (savez appends ``.npz`` to names)."""
    with open(path, "wb") as f:
        np.savez_compressed(f, probabilities=probabilities)


class PredictionOutput:
    """One prediction run's output folder: each case's files and their records."""

    def __init__(self, folder: Path, file_ending: str, save_probabilities: bool) -> None:
        self.folder, self.ending, self.save_probabilities = Path(folder), file_ending, save_probabilities
        self.records = self.folder / RECORD_FOLDER

    def files(self, case: str) -> List[Path]:
        names = [f"{case}{self.ending}"] + ([f"{case}.npz"] if self.save_probabilities else [])
        return [self.folder / n for n in names]

    def _check_records(self) -> None:
        """Refuse a record folder that is a link or not a folder: records are written nowhere but in ``-o``."""
        if self.records.is_symlink() or (self.records.exists() and not self.records.is_dir()):
            what = "a symbolic link" if self.records.is_symlink() else "not a folder"
            raise UserError(f"{self.records} is {what}: {WRITER} keeps its records of what it wrote in this folder of "
                            f"-o; move it away or choose another -o")

    def _record(self, case: str) -> Dict[str, Optional[str]]:
        """``{file name: sha256, or None while being written}`` of ``case``'s record; empty if none or a link."""
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

    def plan(self, cases: Sequence[str], input_files: Sequence[Path], continue_prediction: bool = False,
             overwrite: bool = False) -> List[str]:
        """The cases to predict, in order, after checking every output file: none may be one of ``input_files``, an
        existing one must be ours unless ``overwrite``; ``continue_prediction`` skips done cases. Writes nothing."""
        self._check_records()
        resolved = {Path(f).resolve(): Path(f) for f in input_files}
        identities = {}
        for f in input_files:
            st = os.stat(f)
            identities[(st.st_dev, st.st_ino)] = Path(f)
        todo, foreign = [], []
        for case in cases:
            record, done = self._record(case), True
            for path in self.files(case):
                same = resolved.get(path.resolve())
                if same is None and path.exists():
                    st = os.stat(path)
                    same = identities.get((st.st_dev, st.st_ino))
                if same is not None:
                    raise UserError(f"{path} (the output of case {case}) would overwrite the input file {same}: the "
                                    f"predictor never writes into its inputs; choose another -o")
                ours = self._is_ours(path, record)
                if os.path.lexists(path) and not ours:
                    foreign.append(path)
                done = done and ours and record[path.name] is not None
            if not (continue_prediction and done):
                todo.append(case)
        if foreign and not overwrite:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise UserError(f"{foreign[0]}{more} exists and was not written by {WRITER} (or was changed since): pass "
                            f"--overwrite to replace such files, or choose another -o")
        return todo

    def _create(self) -> None:
        """Make the output and record folders at the first write (a run refused before it leaves no folder)."""
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
        """Write ``case``'s mask (1, X, Y) (and ``probabilities`` (K, 1, X, Y)), each whole, recorded before and after
        (other files of its record stay recorded); returns the mask's path."""
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
