"""Kvasir-SEG and Kvasir-Sessile (colonoscopy polyps, Jha et al. 2020 / 2021).

SRC is, or holds, ``Kvasir-SEG`` (1000 pairs ``images/*.jpg``, ``masks/*.jpg``; RGB JPEG masks, foreground where the
brightest channel is above 127) or ``sessile-main-Kvasir-SEG`` (196 pairs, grey JPEG masks, all also in Kvasir-SEG).
The paper's splits, 880 / 120 (train / test) and 156 / 20 / 20 (train / val / test), do not ship with the data:
``splits/kvasir_seg.json`` and ``splits/kvasir_sessile.json`` were drawn once from the sorted file names (seed
12345). Kvasir-SEG holds out 88 of its 880 training images as fold-0 validation, so fold 0 trains on 792.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .cases import BINARY_RGB_CHANNELS, ConversionPlan, DatasetSpec
from .image_io import check_2d_sizes, inspect_case_mask, write_binary_2d_case
from .source_files import find_source_root, pair_images_and_masks
from .split_lists import plan_from_shipped_split

__all__ = ["KVASIR_SEG_SPEC", "KVASIR_SESSILE_SPEC", "plan_kvasir_seg", "plan_kvasir_sessile"]

_REFERENCE = "https://datasets.simula.no/kvasir-seg/"

KVASIR_SEG_SPEC = DatasetSpec(
    name="KvasirSEG", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "polyp": 1}, file_ending=".png",
    check_case=check_2d_sizes, inspect_mask=inspect_case_mask, write_case=write_binary_2d_case,
    reference="Jha et al., Kvasir-SEG: A Segmented Polyp Dataset, MMM 2020. " + _REFERENCE,
    licence="research and education only (see the publisher)",
    description="Kvasir-SEG polyps; test = 120 images of the shipped seeded 880/120 split",
)

KVASIR_SESSILE_SPEC = replace(
    KVASIR_SEG_SPEC, name="KvasirSessile",
    reference="Jha et al., A Comprehensive Study on Colorectal Polyp Segmentation with ResUNet++, "
              "Conditional Random Field and Test-Time Augmentation, IEEE JBHI 2021. " + _REFERENCE,
    description="Kvasir-Sessile polyps; shipped seeded 156/20/20 split",
)


def _plan(source: Path, dataset: str, spec: DatasetSpec, subfolders, split_file: str) -> ConversionPlan:
    root = find_source_root(source, dataset, ("images", "masks"), subfolders)
    cases = pair_images_and_masks(root / "images", root / "masks", dataset, (".jpg", ".jpeg"), (".jpg", ".jpeg"))
    return plan_from_shipped_split(spec, root, cases, split_file, dataset)


def plan_kvasir_seg(source: Path) -> ConversionPlan:
    """Kvasir-SEG with the shipped 792 train / 88 val / 120 test lists."""
    return _plan(source, "kvasir-seg", KVASIR_SEG_SPEC, ("", "Kvasir-SEG", "kvasir-seg"), "kvasir_seg.json")


def plan_kvasir_sessile(source: Path) -> ConversionPlan:
    """Kvasir-Sessile with the shipped 156 train / 20 val / 20 test lists."""
    return _plan(source, "kvasir-sessile", KVASIR_SESSILE_SPEC,
                 ("", "sessile-main-Kvasir-SEG", "Kvasir-Sessile"), "kvasir_sessile.json")
