"""CVC-ClinicDB (612 colonoscopy frames, Bernal et al. 2015).

SRC holds ``Original/N.tif`` and ``Ground Truth/N.tif`` (or ``GroundTruth``; PNGs too); the faint background of some
PNG masks (around 11 of 255) is read as background. All cases are test cases (``numTraining`` 0), predicted by a
model trained on Kvasir-SEG (the Kvasir -> CVC-ClinicDB protocol); ``--split_file`` makes a training dataset.
"""
from __future__ import annotations

from pathlib import Path

from .cases import BINARY_RGB_CHANNELS, ConversionPlan, DatasetSpec
from .image_io import check_2d_sizes, inspect_case_mask, write_binary_2d_case
from .source_files import existing_source, pair_images_and_masks

__all__ = ["CVC_CLINICDB_SPEC", "plan_cvc_clinicdb"]

_SUFFIXES = (".tif", ".tiff", ".png", ".bmp")

CVC_CLINICDB_SPEC = DatasetSpec(
    name="CVCClinicDB", channel_names=BINARY_RGB_CHANNELS, labels={"background": 0, "polyp": 1},
    file_ending=".png", check_case=check_2d_sizes, inspect_mask=inspect_case_mask, write_case=write_binary_2d_case,
    reference="Bernal et al., WM-DOVA maps for accurate polyp highlighting in colonoscopy, CMIG 2015",
    licence="research only (see the publisher)",
    description="CVC-ClinicDB polyps; all cases are test cases (Kvasir -> CVC-ClinicDB generalisation)",
)


def plan_cvc_clinicdb(source: Path) -> ConversionPlan:
    """CVC-ClinicDB with every case in the test set."""
    source = existing_source(source, "cvc-clinicdb")
    truth = next((source / n for n in ("Ground Truth", "GroundTruth") if (source / n).is_dir()),
                 source / "Ground Truth")
    cases = pair_images_and_masks(source / "Original", truth, "cvc-clinicdb", _SUFFIXES, _SUFFIXES)
    return ConversionPlan(CVC_CLINICDB_SPEC, source, cases, [], [], sorted(cases, key=_numeric_first),
                          split_origin="all cases are test cases")


def _numeric_first(case_id: str):
    return (0, int(case_id), "") if case_id.isdigit() else (1, 0, case_id)
