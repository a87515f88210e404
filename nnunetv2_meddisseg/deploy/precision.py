"""What ``--precision`` means at prediction: which graph of a fold runs, and whether the export verified it.

fp32 runs the fold's ``model.onnx``. bf16 and int8 run only where ``nnUNetv2_meddisseg_export`` verified them on
the fold's validation cases (``deploy.precision_guard``) and recorded the outcome in the fold's entry of
``onnx_model.json``::

    "precisions": {
      "int8": {"verified": true, "model": "fold_0/model_int8.xml",
               "files": {"fold_0/model_int8.xml": "<sha256>", "fold_0/model_int8.bin": "<sha256>"},
               "kept_in_fp32": [...], "figures": {...}},
      "bf16": {"verified": true, "model": "fold_0/model.onnx", "files": {}, "kept_in_fp32": [], "figures": {...}}
    }

A precision the export did not verify (or refused: ``"verified": false`` and its ``reason``) is refused in one
line, as is a file whose sha256 is not the recorded one. Reduced precisions run on OpenVINO only.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.deploy.runtimes import OnnxRuntimeSession, OpenVinoSession, require_bf16

__all__ = ["PRECISIONS", "REDUCED_PRECISIONS", "file_sha256", "fold_graph", "fold_session"]

PRECISIONS = ("fp32", "bf16", "int8")
#: the precisions the export verifies and records per fold
REDUCED_PRECISIONS = ("bf16", "int8")


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fold_graph(folder: Path, fold: dict, precision: str, runtime: str) -> Tuple[Path, str]:
    """The graph file of one fold's entry (``onnx_model.json``'s ``folds[i]``) that runs in ``precision`` on
    ``runtime``, and the precision its session runs in; one line where it may not run."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    folder = Path(folder)
    if precision == "fp32":
        return folder / fold["file"], precision
    if runtime != "openvino":
        raise UserError(f"--precision {precision} runs on --runtime openvino only")
    if precision == "bf16":
        require_bf16()
    record = fold.get("precisions", {}).get(precision)
    if record is None:
        raise UserError(f"--precision {precision}: fold {fold['fold']} of {folder} was not verified in {precision} at "
                        f"export (export it with nnUNetv2_meddisseg_export --{precision})")
    if not record.get("verified"):
        raise UserError(f"--precision {precision}: the export did not verify fold {fold['fold']} in {precision} "
                        f"({record.get('reason', 'no reason recorded')})")
    for name, expected in record["files"].items():
        path = folder / name
        if not path.is_file():
            raise UserError(f"{path}: missing ({precision} graph of fold {fold['fold']})")
        if file_sha256(path) != expected:
            raise UserError(f"{path}: its sha256 is not the one the export recorded (the file was changed after "
                            f"export): export the model again")
    return folder / record["model"], precision


def fold_session(folder: Path, fold: dict, runtime: str, precision: str = "fp32",
                 providers: Sequence[Union[str, Tuple[str, dict]]] = ("CPUExecutionProvider",),
                 threads: Optional[int] = None):
    """A session (``deploy.runtimes``) of one fold's graph in ``precision`` on ``runtime`` (providers: ONNX Runtime's
    only)."""
    path, precision = fold_graph(folder, fold, precision, runtime)
    if runtime == "onnxruntime":
        return OnnxRuntimeSession(path, providers, threads)
    return OpenVinoSession(path, precision, threads)
