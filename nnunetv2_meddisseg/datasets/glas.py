"""GlaS (MICCAI 2015 gland segmentation challenge, Warwick-QU; Sirinukunwattana et al. 2017).

SRC is ``Warwick QU Dataset (Released 2016_07_08)/`` or its parent: ``train_N.bmp`` + ``train_N_anno.bmp`` (85),
the same for ``testA`` (60) and ``testB`` (20); every gland of the instance labels becomes label 1. Split: the
paper's 85 train / 80 test (testA + testB); fold-0 validation is a seeded 10 % of training (8, seed 12345, drawn
from the sorted IDs at conversion time), so fold 0 trains on 77.
"""
from __future__ import annotations

import re
from functools import partial
from pathlib import Path

from .cases import BINARY_RGB_CHANNELS, ConversionPlan, DatasetSpec
from .errors import MissingSourceError
from .image_io import check_2d_sizes, write_binary_2d_case
from .source_files import existing_source, list_files, pair_images_and_masks
from .split_lists import SPLIT_SEED, holdout_count, make_seeded_split

__all__ = ["GLAS_SPEC", "GLAS_FOLDER", "plan_glas"]

GLAS_FOLDER = "Warwick QU Dataset (Released 2016_07_08)"
_IMAGE = re.compile(r"^(train|testA|testB)_\d+$")
_EXPECTED = {"train": 85, "testA": 60, "testB": 20}

GLAS_SPEC = DatasetSpec(
    name="GlaS", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "gland": 1}, file_ending=".png",
    check_case=check_2d_sizes, write_case=partial(write_binary_2d_case, instance_mask=True),
    reference="Sirinukunwattana et al., Gland segmentation in colon histology images: The GlaS challenge "
              "contest, Medical Image Analysis 2017",
    licence="research only (see the Warwick-QU dataset terms)",
    description="GlaS glands (instance labels made binary); test = testA + testB",
)


def plan_glas(source: Path) -> ConversionPlan:
    """GlaS: 85 training images (77 train + 8 seeded val) and 80 test images."""
    root = _find_root(source)
    images = {p.stem: p for p in list_files(root, (".bmp",)) if _IMAGE.match(p.stem)}
    cases = pair_images_and_masks(root, root, "glas", (".bmp",), (".bmp",), mask_tag="_anno", image_ids=images)
    train_all = [c for c in cases if c.startswith("train_")]
    test = [c for c in cases if not c.startswith("train_")]
    train, val, _ = make_seeded_split(train_all, holdout_count(len(train_all)), 0, SPLIT_SEED)
    notes = []
    for prefix, n in _EXPECTED.items():
        found = sum(c.startswith(prefix + "_") for c in cases)
        if found != n:
            notes.append(f"glas: found {found} {prefix} images in {root}, the published set has {n}")
    return ConversionPlan(GLAS_SPEC, root, cases, train, val, sorted(test),
                          split_origin=f"GlaS train / testA+testB; val = seeded {len(val)} of the training "
                                       f"images (seed {SPLIT_SEED})", notes=notes)


def _find_root(source: Path) -> Path:
    source = existing_source(source, "glas")
    for root in (source / GLAS_FOLDER, source):
        if root.is_dir() and any(_IMAGE.match(p.stem) for p in root.glob("*.bmp")):
            return root
    raise MissingSourceError(f"glas: no train_N.bmp / testA_N.bmp / testB_N.bmp images in {source} "
                             f"or {source / GLAS_FOLDER}")
