"""Kvasir-SEG and Kvasir-Sessile (colonoscopy polyps, Jha et al. 2020 / 2021).

Source layouts, as published:

- ``kvasir-seg``: ``Kvasir-SEG/images/*.jpg`` and ``Kvasir-SEG/masks/*.jpg`` (1000 pairs; the
  masks are RGB JPEGs, read by the mask rule of ``image_io.read_binary_mask``: foreground where the
  brightest channel is above 127); ``kavsir_bboxes.json`` is not used. SRC may be the
  ``Kvasir-SEG`` folder or its parent.
- ``kvasir-sessile``: ``sessile-main-Kvasir-SEG/images/*.jpg`` and ``masks/*.jpg`` (196 pairs,
  grey JPEG masks). SRC may be that folder or its parent.

Splits. The paper uses 880 / 120 (train / test) for Kvasir-SEG and 156 / 20 / 20 (train / val /
test) for Kvasir-Sessile. Neither list ships with the data, so the lists in
``splits/kvasir_seg.json`` and ``splits/kvasir_sessile.json`` were drawn once from the sorted
file names with :func:`~nnunetv2_meddisseg.datasets.split_lists.make_seeded_split` (seed 12345) and
are shipped so that everyone gets the same split. Kvasir-SEG has no validation set: 88 of its
880 training images (10 %) are held out as nnU-Net's fold-0 validation set, so fold 0 trains on
792 images. The 120 (Kvasir-SEG) and 20 (Sessile) test images go to ``imagesTs``/``labelsTs``.
``--split_file`` replaces the shipped lists (e.g. with the MediaEval-2020 ``train.txt`` /
``val.txt`` lists turned into JSON). Kvasir-Sessile's 196 images are all also in Kvasir-SEG.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from .cases import BINARY_RGB_CHANNELS, ConversionPlan, DatasetSpec
from .image_io import check_2d_sizes, inspect_case_mask, write_binary_2d_case
from .source_files import find_source_root, pair_images_and_masks
from .split_lists import plan_from_shipped_split

__all__ = ["KVASIR_SEG_SPEC", "KVASIR_SESSILE_SPEC", "plan_kvasir_seg", "plan_kvasir_sessile"]

_REFERENCE = "https://datasets.simula.no/kvasir-seg/"

KVASIR_SEG_SPEC = DatasetSpec(
    name="KvasirSEG", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "polyp": 1}, file_ending=".png",
    check_case=check_2d_sizes, inspect_mask=inspect_case_mask,
    write_case=partial(write_binary_2d_case, instance_mask=False),
    reference="Jha et al., Kvasir-SEG: A Segmented Polyp Dataset, MMM 2020. " + _REFERENCE,
    licence="research and education only (see the publisher)",
    description="Kvasir-SEG polyps; test = 120 images of the shipped seeded 880/120 split",
)

KVASIR_SESSILE_SPEC = DatasetSpec(
    name="KvasirSessile", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "polyp": 1},
    file_ending=".png", check_case=check_2d_sizes, inspect_mask=inspect_case_mask,
    write_case=partial(write_binary_2d_case, instance_mask=False),
    reference="Jha et al., A Comprehensive Study on Colorectal Polyp Segmentation with ResUNet++, "
              "Conditional Random Field and Test-Time Augmentation, IEEE JBHI 2021. " + _REFERENCE,
    licence="research and education only (see the publisher)",
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
