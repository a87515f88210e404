"""Tiny source-tree generators and readers for the converter tests (publishers' layouts)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
from PIL import Image


def random_rgb(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def blob_mask(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A {0, 255} mask with one filled ellipse."""
    yy, xx = np.mgrid[0:height, 0:width]
    cy, cx = rng.uniform(0.3, 0.7) * height, rng.uniform(0.3, 0.7) * width
    ry, rx = rng.uniform(0.15, 0.3) * height, rng.uniform(0.15, 0.3) * width
    return ((((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1) * 255).astype(np.uint8)


def save(array: np.ndarray, path: Path, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, **kwargs)
    return path


def make_pairs(image_dir: Path, mask_dir: Path, ids: Iterable[str], image_suffix: str, mask_suffix: str,
               mask_tag: str = "", size: Tuple[int, int] = (24, 20), rgb_mask: bool = False, seed: int = 0,
               instance: bool = False) -> Dict[str, Tuple[Path, Path]]:
    """Random RGB images and ellipse masks; ``instance`` writes labels 1..3 for three blobs."""
    rng = np.random.default_rng(seed)
    height, width = size
    out = {}
    for case_id in ids:
        img = save(random_rgb(rng, height, width), image_dir / f"{case_id}{image_suffix}")
        if instance:
            mask = np.zeros((height, width), np.uint8)
            for k in (1, 2, 3):
                mask[blob_mask(rng, height, width) > 0] = k
        else:
            mask = blob_mask(rng, height, width)
        if rgb_mask:
            mask = np.repeat(mask[..., None], 3, axis=-1)
        msk = save(mask, mask_dir / f"{case_id}{mask_tag}{mask_suffix}")
        out[case_id] = (img, msk)
    return out


def make_kvasir_tree(root: Path, ids: Sequence[str], size=(24, 20), seed: int = 0) -> Path:
    """``root/images/*.jpg`` + ``root/masks/*.jpg`` (RGB JPEG masks, as Kvasir-SEG ships them)."""
    make_pairs(root / "images", root / "masks", ids, ".jpg", ".jpg", size=size, rgb_mask=True, seed=seed)
    return root


def write_split(path: Path, train=(), val=(), test=()) -> Path:
    path.write_text(json.dumps({"train": list(train), "val": list(val), "test": list(test)}))
    return path


def expected_binary(mask_path: Path) -> np.ndarray:
    """Independent reference of the rule for JPEG masks: the brightest channel of each pixel > 127."""
    arr = np.asarray(Image.open(mask_path)).astype(np.int64)
    if arr.ndim == 3:
        arr = arr.max(axis=-1)
    return (arr > 127).astype(np.uint8)


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img)


def case_ids(folder: Path, ending: str = ".png", channel: Optional[str] = "_0000") -> set:
    suffix = (channel or "") + ending
    return {p.name[: -len(suffix)] for p in folder.iterdir() if p.name.endswith(suffix)}
