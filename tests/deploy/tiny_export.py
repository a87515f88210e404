"""Tiny export folders and input folders for the deploy tests: a two-layer convolutional network per fold, traced
to ONNX as the exporter writes its graphs (the description's fields in its metadata, as the export binds them:
``deploy.description.bind_graph``), and the description the exporter would write for it."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn

from nnunetv2_meddisseg.deploy.description import (
    DESCRIPTION_FILE,
    FORMAT_VERSION,
    WRITTEN_BY,
    bind_graph,
    fold_model_file,
    sha256_of,
)

__all__ = ["traced_graph", "tiny_graph", "export_tiny", "description_of", "write_description", "write_cases",
           "CASE_SHAPES"]

#: (height, width) of the cases :func:`write_cases` writes: one patch, larger than it, smaller than it
CASE_SHAPES = [(16, 16), (29, 21), (9, 12)]


def traced_graph(seed: int, in_channels: int = 3, out_channels: int = 2) -> bytes:
    """A (B, in_channels, H, W) -> (B, out_channels, H, W) network as ONNX bytes, B, H and W symbolic, without
    the description's fields (the predictor refuses it)."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.Tanh(),
                        nn.Conv2d(4, out_channels, 3, padding=1)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(1, in_channels, 16, 16),), buffer, input_names=["image"],
                      output_names=["logits"], opset_version=18, dynamo=False,
                      dynamic_axes={n: {0: "b", 2: "h", 3: "w"} for n in ("image", "logits")})
    return buffer.getvalue()


def tiny_graph(seed: int, in_channels: int = 3, out_channels: int = 2, description: Optional[dict] = None) -> bytes:
    """:func:`traced_graph` with the fields of ``description`` (None: :func:`description_of`'s) in its metadata,
    as the export writes its graphs."""
    return bind_graph(traced_graph(seed, in_channels, out_channels),
                      description_of({}) if description is None else description)


def description_of(graphs: dict, **fields) -> dict:
    """The description of a 3-channel, 2-class 16x16-patch model whose folds' graphs are ``graphs``
    (fold -> bytes); ``fields`` replace its fields."""
    return {
        "format_version": FORMAT_VERSION, "written_by": WRITTEN_BY, "trainer": "tiny", "plans": "nnUNetPlans",
        "configuration": "2d", "checkpoint": "checkpoint_final.pth",
        "folds": [{"fold": str(f), "file": fold_model_file(f), "sha256": sha256_of(g), "checks": []}
                  for f, g in graphs.items()],
        "patch_size": [16, 16], "num_input_channels": 3, "num_segmentation_heads": 2,
        "normalization": [{"scheme": "ZScoreNormalization", "use_mask_for_norm": False,
                           "intensity_properties": {}}] * 3,
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2], "file_ending": ".png",
        "labels": {"background": 0, "polyp": 1}, "regions_class_order": None, "mirror_axes": [0, 1],
        "tile_step_size": 0.5, "spacing": [1.0, 1.0], **fields}


def write_description(folder: Path, description: dict) -> None:
    (Path(folder) / DESCRIPTION_FILE).write_text(json.dumps(description))


def export_tiny(folder: Path, folds: Sequence[int] = (0, 1), **fields) -> dict:
    """An export folder of :func:`tiny_graph` per fold (seed = fold) and its description (``fields`` replace
    :func:`description_of`'s, the graphs' channels and classes the description's); returns the description."""
    fields_of = description_of({}, **fields)
    graphs = {fold: tiny_graph(fold, fields_of["num_input_channels"], fields_of["num_segmentation_heads"], fields_of)
              for fold in folds}
    for fold, graph in graphs.items():
        (Path(folder) / f"fold_{fold}").mkdir(parents=True)
        (Path(folder) / fold_model_file(fold)).write_bytes(graph)
    description = description_of(graphs, **fields)
    write_description(folder, description)
    return description


def write_cases(folder: Path, names: Sequence[str] = ("case0", "case1", "case2"), seed: int = 0) -> None:
    """RGB cases ``<name>_0000.png`` of :data:`CASE_SHAPES` (cycled)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        shape = CASE_SHAPES[i % len(CASE_SHAPES)]
        Image.fromarray(rng.integers(0, 256, (*shape, 3)).astype(np.uint8)).save(folder / f"{name}_0000.png")
