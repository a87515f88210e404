"""What ``--precision`` means at prediction: which graph of a fold runs, and whether the export verified it.

fp32 runs the fold's ``model.onnx``. bf16 and int8 run only where the export verified them on the fold's
validation cases and recorded it in the fold's entry of ``onnx_model.json``::

    "precisions": {"int8": {"verified": true, "model": "fold_0/model_int8.xml", "files": {"<.xml, .bin>": "<sha256>"},
                            "kept_in_fp32": [...], "figures": {...}, "calibration_tiles": 64,
                            "floats_in_bf16": {"verified": true, "figures": {...}}},
                   "bf16": {"verified": true, "model": "fold_0/model.onnx", "files": {}, "kept_in_fp32": [], ...}}

A precision the export did not verify or refused (``"verified": false`` and its ``reason``) is refused in one line.
An int8 graph's float operations run in bf16 where ``floats_in_bf16`` is verified and the CPU has native bf16, else
in fp32. Files are checked against their sha256 and handed to the runtime from memory. Reduced precisions run on
OpenVINO only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

from nnunetv2_meddisseg.deploy.description import (
    INPUT_NAME,
    REDUCED_PRECISIONS,
    check_graph_io,
    fold_file,
    model_file,
    read_fold_model,
    read_model_file,
)
from nnunetv2_meddisseg.deploy.runtimes import (
    INT8_FLOATS,
    OnnxRuntimeSession,
    OpenVinoSession,
    openvino_has_bf16,
    read_openvino_model,
    require_bf16,
)
from nnunetv2_meddisseg.errors import UserError

__all__ = ["PRECISIONS", "REDUCED_PRECISIONS", "FoldGraph", "fold_graph", "int8_floats", "fold_session"]

PRECISIONS = ("fp32",) + REDUCED_PRECISIONS


@dataclass(frozen=True)
class FoldGraph:
    """One fold's checked graph: ``model`` (ONNX or IR XML), ``weights`` (the IR's ``.bin``, or None), its ``where``."""
    model: bytes
    weights: Optional[bytes]
    where: str


def fold_graph(folder: Path, fold: dict, precision: str, runtime: str, description: dict) -> FoldGraph:
    """The checked graph of one fold's entry that runs in ``precision`` on ``runtime``; one line if it may not run."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: expected one of {', '.join(PRECISIONS)}")
    folder = Path(folder)
    if precision == "fp32":
        return FoldGraph(read_fold_model(folder, fold, description), None, str(fold_file(folder, fold)))
    if runtime != "openvino":
        raise UserError(f"--precision {precision} runs on --runtime openvino only")
    if precision == "bf16":
        require_bf16()
    record = fold.get("precisions", {}).get(precision)
    if record is None:
        raise UserError(f"--precision {precision}: fold {fold['fold']} of {folder} was not verified in {precision} at "
                        f"export (export it with nnUNetv2_meddisseg_export --{precision})")
    if not record["verified"]:
        raise UserError(f"--precision {precision}: the export did not verify fold {fold['fold']} in {precision} "
                        f"({record['reason']})")
    if record["model"] == fold["file"]:
        return FoldGraph(read_fold_model(folder, fold, description), None, str(fold_file(folder, fold)))
    owner = f"fold {fold['fold']}'s {precision} graph"
    weights = record["model"][:-len(".xml")] + ".bin"
    return FoldGraph(read_model_file(folder, record["model"], record["files"][record["model"]], owner, description),
                     read_model_file(folder, weights, record["files"][weights], owner),
                     str(model_file(folder, record["model"], owner)))


def int8_floats(fold: dict, asked: Optional[str] = None) -> str:
    """The precision of one fold's int8 graph's float operations: ``asked`` (bf16 only if the export verified it), or
    by default bf16 if verified and the CPU has native bf16, else fp32."""
    floats = fold["precisions"]["int8"].get("floats_in_bf16",
                                            {"verified": False, "reason": "not recorded: export it again"})
    if asked is None:
        return "bf16" if floats["verified"] and openvino_has_bf16() else "fp32"
    if asked not in INT8_FLOATS:
        raise UserError(f"int8 float operations in {asked}: expected one of {', '.join(INT8_FLOATS)}")
    if asked == "bf16" and not floats["verified"]:
        raise UserError(f"int8 with bf16 float operations: the export did not verify fold {fold['fold']} so "
                        f"({floats['reason']})")
    return asked


def fold_session(folder: Path, fold: dict, description: dict, runtime: str, precision: str = "fp32",
                 providers: Sequence[Union[str, Tuple[str, dict]]] = ("CPUExecutionProvider",),
                 threads: Optional[int] = None, floats: Optional[str] = None):
    """A session of one fold's graph in ``precision`` on ``runtime``, its input name and shapes checked against
    ``description``. ``providers``: ONNX Runtime's only; ``floats``: an int8 graph's, see ``int8_floats``."""
    graph = fold_graph(folder, fold, precision, runtime, description)
    try:
        if runtime == "onnxruntime":
            session = OnnxRuntimeSession(graph.model, providers, threads)
        else:
            session = OpenVinoSession(read_openvino_model(graph.model, graph.weights), precision, threads,
                                      int8_floats(fold, floats) if precision == "int8" else "fp32")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 (the runtimes report a graph they cannot load as a plain RuntimeError)
        # OpenVINO prefixes its messages with the source lines that raised them
        reason = re.sub(r"Exception from \S+:\d+:\s*", "", " ".join(str(e).split()))[:300]
        if runtime == "onnxruntime":
            names = ", ".join(p if isinstance(p, str) else p[0] for p in providers)
            raise UserError(f"{graph.where}: ONNX Runtime cannot load it ({reason}; providers {names})") from e
        raise UserError(f"{graph.where}: OpenVINO cannot load it ({reason})") from e
    if session.input_names != [INPUT_NAME]:
        raise UserError(f"{graph.where}: the graph's inputs are {session.input_names}, expected one named "
                        f"{INPUT_NAME!r}")
    check_graph_io(session.input_shape, session.output_shape, description, graph.where)
    return session
