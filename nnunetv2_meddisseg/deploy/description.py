"""The description of an exported model: the JSON file beside the folds' ``model.onnx`` files.

``nnUNetv2_meddisseg_export`` writes it, ``nnUNetv2_meddisseg_predict_onnx`` reads it; it holds everything
nnU-Net's predictor takes from the plans, the dataset.json and the checkpoint (patch size, per-channel
normalisation, transpose, labels or regions, mirror axes), what was exported (trainer, plans, configuration,
checkpoint, folds) and each fold's check against PyTorch. Reading it needs neither PyTorch nor nnU-Net.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from nnunetv2_meddisseg.cli import UserError

__all__ = ["DESCRIPTION_FILE", "MODEL_FILE", "FORMAT_VERSION", "INPUT_NAME", "OUTPUT_NAME", "NATURAL_IMAGE_ENDINGS",
           "read_description", "fold_model_file"]

#: the description's file name in an export folder
DESCRIPTION_FILE = "onnx_model.json"
#: each fold's graph: ``fold_<f>/model.onnx``
MODEL_FILE = "model.onnx"
FORMAT_VERSION = 1
#: the graph's input (B, C, H, W) and output (B, segmentation heads, H, W) names
INPUT_NAME, OUTPUT_NAME = "image", "logits"
#: what nnU-Net's 2D natural-image reader (NaturalImage2DIO) reads
NATURAL_IMAGE_ENDINGS = (".png", ".bmp", ".tif")

_REQUIRED = ("format_version", "trainer", "plans", "configuration", "checkpoint", "folds", "patch_size",
             "num_input_channels", "num_segmentation_heads", "normalization", "transpose_forward",
             "transpose_backward", "file_ending", "labels", "regions_class_order", "mirror_axes", "tile_step_size")


def fold_model_file(fold: Any) -> str:
    """A fold's graph, relative to the export folder."""
    return f"fold_{fold}/{MODEL_FILE}"


def read_description(folder: Path) -> Dict[str, Any]:
    """The description in ``folder`` (an export folder), checked for the keys the predictor reads and for the
    fold files it names."""
    path = Path(folder) / DESCRIPTION_FILE
    if not path.is_file():
        raise UserError(f"{folder}: no {DESCRIPTION_FILE} (expected a folder written by nnUNetv2_meddisseg_export)")
    try:
        description = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from e
    missing = [key for key in _REQUIRED if key not in description]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)} (expected a file written by nnUNetv2_meddisseg_export)")
    if description["format_version"] != FORMAT_VERSION:
        raise UserError(f"{path}: format version {description['format_version']}, this predictor reads "
                        f"{FORMAT_VERSION}: export the model again")
    folds: List[dict] = description["folds"]
    for fold in folds:
        if not (Path(folder) / fold["file"]).is_file():
            raise UserError(f"{Path(folder) / fold['file']}: missing (fold {fold['fold']} of {path})")
    return description
