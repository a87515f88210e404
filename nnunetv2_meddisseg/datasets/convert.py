"""``nnUNetv2_meddisseg_convert DATASET SRC -d ID [--resize N] [--split_file F] [--overwrite]
[--mask_threshold T] [--skip_ambiguous]``

Converts a paper dataset from its publisher's layout into ``$nnUNet_raw/DatasetID_Name`` with the paper's split
(train / val as fold 0 of ``splits_final.json``, test in imagesTs), so ``nnUNetv2_train ID 2d 0`` trains and
validates as the paper does. Refused masks stop it before anything is written, unless ``--mask_threshold T`` or
``--skip_ambiguous``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command

from .cases import ConversionPlan, ConversionResult
from .cvc_clinicdb import plan_cvc_clinicdb
from .errors import ConversionError, OptionError
from .glas import plan_glas
from .isic import plan_isic2016, plan_isic2017
from .kvasir import plan_kvasir_seg, plan_kvasir_sessile
from .mask_report import MaskRuleError
from .options import require_env_folder, validate_dataset_id, validate_mask_threshold, validate_resize
from .split_lists import apply_split
from .synapse import plan_synapse
from .writer import write_nnunet_dataset

__all__ = ["CONVERTERS", "convert", "main"]

PROG = "nnUNetv2_meddisseg_convert"

CONVERTERS: Dict[str, Callable[[Path], ConversionPlan]] = {
    "kvasir-seg": plan_kvasir_seg,
    "kvasir-sessile": plan_kvasir_sessile,
    "glas": plan_glas,
    "isic2016": plan_isic2016,
    "isic2017": plan_isic2017,
    "synapse": plan_synapse,
    "cvc-clinicdb": plan_cvc_clinicdb,
}


def convert(dataset: str, source, dataset_id: int, resize: Optional[int] = None, split_file=None,
            overwrite: bool = False, num_processes: int = 1, progress: bool = False,
            mask_threshold: Optional[float] = None, skip_ambiguous: bool = False) -> ConversionResult:
    """Convert ``source`` (in ``dataset``'s layout) into ``$nnUNet_raw/Dataset<dataset_id>_<Name>``; raises
    ``ConversionError`` for bad options or sources and ``MaskRuleError`` (with the report) for refused masks."""
    if dataset not in CONVERTERS:
        raise OptionError(f"unknown dataset {dataset!r}: expected one of {', '.join(CONVERTERS)}")
    validate_resize(resize)
    validate_dataset_id(dataset_id)
    validate_mask_threshold(mask_threshold)
    if num_processes < 1:
        raise OptionError(f"-np must be at least 1, got {num_processes}")
    require_env_folder("nnUNet_raw")
    plan = CONVERTERS[dataset](Path(source))
    if split_file is not None:
        plan = apply_split(plan, Path(split_file))
    return write_nnunet_dataset(plan, dataset_id, resize=resize, overwrite=overwrite, num_processes=num_processes,
                                progress=progress, mask_threshold=mask_threshold, skip_ambiguous=skip_ambiguous)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=DefaultsHelpFormatter,
        description="Convert a paper dataset (publisher's layout) into an nnU-Net v2 raw dataset with the paper's "
                    "split (fold 0 of splits_final.json; test set in imagesTs/labelsTs).")
    parser.add_argument("dataset", choices=list(CONVERTERS), metavar="DATASET",
                        help=f"one of: {', '.join(CONVERTERS)}")
    parser.add_argument("source", metavar="SRC", help="the dataset folder as downloaded and unzipped")
    parser.add_argument("-d", dest="dataset_id", type=int, required=True, metavar="ID", help="nnU-Net dataset ID")
    parser.add_argument("--resize", type=int, default=None, metavar="N",
                        help="resize every image and mask to NxN (paper: 256; images bilinear, masks nearest; "
                             "Synapse: each axial slice; default: keep the original size)")
    parser.add_argument("--split_file", default=None, metavar="F",
                        help="JSON with lists of case IDs under 'train', 'val', 'test' (default: the paper's split, "
                             "or the package's seeded lists where the publisher ships none)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset with this ID")
    parser.add_argument("--mask_threshold", type=float, default=None, metavar="T",
                        help="foreground: the mask values above T (e.g. 127 for 8-bit masks), for every mask that is "
                             "not a plain label; recorded in dataset.json (default: the mask rule's bands, see "
                             "docs/data.md)")
    parser.add_argument("--skip_ambiguous", action="store_true",
                        help="leave out (and name) the cases whose masks the mask rule refuses instead of stopping")
    parser.add_argument("-np", dest="num_processes", type=int, default=min(4, os.cpu_count() or 1),
                        help="worker processes (default: min(4, CPU count))")
    return parser


def _convert_command(argv: Optional[List[str]]) -> None:
    args = _parser().parse_args(argv)
    try:
        result = convert(**vars(args), progress=sys.stderr.isatty())
    except MaskRuleError as err:
        print("\n".join(err.report.summary_lines()), flush=True)
        raise
    for line in result.mask_report:
        print(line)
    for note in result.notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    split = f"{result.num_train} train / {result.num_val} val" if result.num_val else f"{result.num_train} train"
    print(f"{result.dataset_name}: {split} (imagesTr), {result.num_test} test (imagesTs) -> {result.raw_folder}")
    for f in result.splits_files:
        print(f"fold-0 split: {f}")


def main(argv: Optional[List[str]] = None) -> int:
    """Console entry point; returns 0, or 2 after a one-line error."""
    return run_command(PROG, _convert_command, argv, user_errors=(ConversionError,))


if __name__ == "__main__":
    sys.exit(main())
