"""ISIC-2016 and ISIC-2017 lesion segmentation (part 1 of the ISBI challenges).

SRC holds the unzipped archives: ``ISBI2016_ISIC_Part1_{Training,Test}_{Data,GroundTruth}`` (900 / 379, all
required) or ``ISIC-2017_{Training,Validation,Test_v2}_Data`` with ``..._Part1_GroundTruth`` (the official 2000 /
150 / 600; only training is required: else a seeded 10 % of it is validation and ``imagesTs`` stays empty, each
with a note). ISIC-2016's fold-0 validation is a seeded 10 % of training (90, seed 12345, drawn from the sorted
IDs at conversion time), so fold 0 trains on 810. Masks are 0/255 PNGs, written as 0/1.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, List

from .cases import BINARY_RGB_CHANNELS, ConversionPlan, DatasetSpec, SourceCase
from .errors import ConversionError, MissingSourceError
from .image_io import check_2d_sizes, inspect_case_mask, write_binary_2d_case
from .source_files import existing_source, pair_images_and_masks
from .split_lists import SPLIT_SEED, holdout_count, make_seeded_split

__all__ = ["ISIC2016_SPEC", "ISIC2017_SPEC", "plan_isic2016", "plan_isic2017"]

_IMAGES = (".jpg", ".jpeg")
_MASKS = (".png",)

ISIC2016_SPEC = DatasetSpec(
    name="ISIC2016", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "lesion": 1}, file_ending=".png",
    check_case=check_2d_sizes, inspect_mask=inspect_case_mask, write_case=write_binary_2d_case,
    reference="Gutman et al., Skin Lesion Analysis toward Melanoma Detection (ISBI 2016), arXiv:1605.01397",
    licence="CC-BY-NC (ISIC Archive)", description="ISIC-2016 part 1 lesion segmentation; official 900/379",
)

ISIC2017_SPEC = replace(
    ISIC2016_SPEC, name="ISIC2017",
    reference="Codella et al., Skin Lesion Analysis Toward Melanoma Detection (ISBI 2017), arXiv:1710.05006",
    description="ISIC-2017 part 1 lesion segmentation; official 2000/150/600",
)


def _pair(source: Path, data: str, truth: str, dataset: str, tag: str,
          required: bool) -> Dict[str, SourceCase]:
    data_dir, truth_dir = source / data, source / truth
    if not data_dir.is_dir() and not truth_dir.is_dir():
        if required:
            raise MissingSourceError(f"{dataset}: folder {data_dir} does not exist (expected the unzipped "
                                     f"{data} and {truth} archives in {source})")
        return {}
    if not data_dir.is_dir() or not truth_dir.is_dir():
        present, absent = (data_dir, truth_dir) if data_dir.is_dir() else (truth_dir, data_dir)
        raise MissingSourceError(f"{dataset}: {present} exists but {absent} is missing")
    return pair_images_and_masks(data_dir, truth_dir, dataset, _IMAGES, _MASKS, mask_tag=tag,
                                 image_exclude=r"_superpixels\.")


def _merge(*groups: Dict[str, SourceCase]) -> Dict[str, SourceCase]:
    merged: Dict[str, SourceCase] = {}
    for g in groups:
        for c, case in g.items():
            if c in merged:
                raise ConversionError(f"case {c} appears twice: {merged[c].image} and {case.image}")
            merged[c] = case
    return merged


def plan_isic2016(source: Path) -> ConversionPlan:
    """ISIC-2016: 900 training images (810 train + 90 seeded val) and 379 test images."""
    source = existing_source(source, "isic2016")
    train_all = _pair(source, "ISBI2016_ISIC_Part1_Training_Data", "ISBI2016_ISIC_Part1_Training_GroundTruth",
                      "isic2016", "_Segmentation", required=True)
    test = _pair(source, "ISBI2016_ISIC_Part1_Test_Data", "ISBI2016_ISIC_Part1_Test_GroundTruth",
                 "isic2016", "_Segmentation", required=True)
    train, val, _ = make_seeded_split(train_all, holdout_count(len(train_all)), 0, SPLIT_SEED)
    return ConversionPlan(ISIC2016_SPEC, source, _merge(train_all, test), train, val, sorted(test),
                          split_origin=f"ISIC-2016 official training / test; val = seeded {len(val)} of the "
                                       f"training images (seed {SPLIT_SEED})")


def plan_isic2017(source: Path) -> ConversionPlan:
    """ISIC-2017: official 2000 train / 150 val / 600 test (val and test optional)."""
    source = existing_source(source, "isic2017")
    tag = "_segmentation"
    train_all = _pair(source, "ISIC-2017_Training_Data", "ISIC-2017_Training_Part1_GroundTruth", "isic2017", tag,
                      required=True)
    val_cases = _pair(source, "ISIC-2017_Validation_Data", "ISIC-2017_Validation_Part1_GroundTruth", "isic2017",
                      tag, required=False)
    test_cases = _pair(source, "ISIC-2017_Test_v2_Data", "ISIC-2017_Test_v2_Part1_GroundTruth", "isic2017", tag,
                       required=False)
    notes: List[str] = []
    if not val_cases:
        train, val, _ = make_seeded_split(train_all, holdout_count(len(train_all)), 0, SPLIT_SEED)
        notes.append(f"isic2017: no ISIC-2017_Validation_Data in {source}: used a seeded {len(val)} of the "
                     f"{len(train_all)} training images as validation")
        origin_val = f"seeded {len(val)} of the training images (seed {SPLIT_SEED})"
    else:
        train, val = sorted(train_all), sorted(val_cases)
        origin_val = "official validation set"
    if not test_cases:
        notes.append(f"isic2017: no ISIC-2017_Test_v2_Data in {source}: no test set written (imagesTs is empty)")
    cases = _merge(train_all, val_cases, test_cases)
    return ConversionPlan(ISIC2017_SPEC, source, cases, train, val, sorted(test_cases),
                          split_origin=f"ISIC-2017 official training / test; val = {origin_val}", notes=notes)
