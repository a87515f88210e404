"""A tiny generated polyp-like dataset in nnU-Net's raw format (no download needed).

Each image: mottled pink "mucosa" with one or two darker, textured ellipses ("polyps", the label) of varying
contrast, size and blur. Plans, trains and predicts on a 2-core CPU in minutes; an untrained network scores poorly.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Tuple

import numpy as np
from PIL import Image, ImageFilter

from nnunetv2_meddisseg.files import replace_folder, temporary_sibling

__all__ = ["make_synthetic_dataset", "synthetic_case"]

DATASET_NAME = "SyntheticPolyps"


def synthetic_case(rng: np.random.Generator, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """One case: image (size, size, 3) uint8 and label (size, size) uint8 in {0, 1}."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    base = np.array([200, 120, 110], dtype=np.float32) + rng.normal(0, 12, 3)
    coarse = rng.normal(0, 1, (size // 8 + 1, size // 8 + 1))
    coarse = np.kron(coarse, np.ones((8, 8)))[:size, :size]
    image = base[None, None, :] + 14 * coarse[..., None] + rng.normal(0, 6, (size, size, 3))
    label = np.zeros((size, size), dtype=np.uint8)
    for _ in range(rng.integers(1, 3)):
        cy, cx = rng.uniform(0.2, 0.8, 2) * size
        ry, rx = rng.uniform(0.08, 0.25, 2) * size
        angle = rng.uniform(0, np.pi)
        dy, dx = yy - cy, xx - cx
        u = (dx * np.cos(angle) + dy * np.sin(angle)) / rx
        v = (-dx * np.sin(angle) + dy * np.cos(angle)) / ry
        inside = u ** 2 + v ** 2 <= 1.0
        label[inside] = 1
        contrast = rng.uniform(25, 60)
        tint = np.array([-1.0, -0.6, -0.3]) * contrast
        texture = rng.normal(0, 10, (size, size, 1))
        image[inside] += tint + texture[inside]
    blurred = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))
    blurred = blurred.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 1.2))))
    return np.asarray(blurred), label


def make_synthetic_dataset(raw_dir: str | Path, dataset_id: int = 501, num_train: int = 12, num_test: int = 4,
                           size: int = 64, seed: int = 0, overwrite: bool = False) -> Path:
    """Write ``Dataset{ID}_SyntheticPolyps`` under ``raw_dir`` and return its path; an existing one is replaced only
    with ``overwrite``. Written into a hidden sibling and moved into place whole."""
    if size < 16 or size % 16:
        raise ValueError(f"size must be a positive multiple of 16, got {size}")
    target = Path(raw_dir) / f"Dataset{dataset_id:03d}_{DATASET_NAME}"
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists (pass overwrite=True to replace it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = temporary_sibling(target, folder=True)  # a failed run's is removed by the next one
    rng = np.random.default_rng(seed)
    for split, count in (("Tr", num_train), ("Ts", num_test)):
        (partial / f"images{split}").mkdir(parents=True)
        (partial / f"labels{split}").mkdir(parents=True)
        for i in range(count):
            case = f"synth_{split.lower()}_{i:03d}"
            image, label = synthetic_case(rng, size)
            Image.fromarray(image).save(partial / f"images{split}" / f"{case}_0000.png")
            Image.fromarray(label).save(partial / f"labels{split}" / f"{case}.png")
    dataset_json = {
        "channel_names": {"0": "R", "1": "G", "2": "B"},
        "labels": {"background": 0, "polyp": 1},
        "numTraining": num_train,
        "file_ending": ".png",
        "name": DATASET_NAME,
        "description": "Generated polyp-like RGB images (nnunetv2_meddisseg.datasets.synthetic)",
    }
    (partial / "dataset.json").write_text(json.dumps(dataset_json, indent=2))
    replace_folder(partial, target)
    return target
