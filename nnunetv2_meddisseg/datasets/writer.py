"""Writing an nnU-Net v2 raw dataset atomically.

The dataset is written into a hidden sibling (``.DatasetXXX_Name.<random>.partial``) and renamed into place once
every case is written, so a failed conversion leaves no valid-looking dataset; one set aside (``.old``) by a
conversion killed mid-replace is put back by the next. A user's file of such a name is never touched. Fold 0 goes
to ``splits_final.json`` in the raw folder (nnU-Net's planner copies it) and, if set, ``$nnUNet_preprocessed``.
"""
from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from nnunetv2_meddisseg.files import replace_folder, restore_set_aside, temporary_sibling, write_atomically

from .cases import ConversionPlan, ConversionResult
from .errors import ConversionError, OptionError
from .mask_report import MaskRuleError, run_in_workers, survey_masks
from .options import optional_env_folder, require_env_folder
from .split_lists import leave_out_cases

__all__ = ["write_nnunet_dataset"]


def _write_json_atomic(data, path: Path) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8"))


def write_nnunet_dataset(plan: ConversionPlan, dataset_id: int, resize: Optional[int] = None,
                         overwrite: bool = False, num_processes: int = 1, progress: bool = False,
                         mask_threshold: Optional[float] = None, skip_ambiguous: bool = False) -> ConversionResult:
    """Write the plan as ``$nnUNet_raw/DatasetXXX_<spec.name>``: train + val to imagesTr/labelsTr, test to imagesTs.

    An existing dataset with this ID is refused unless ``overwrite``, and always under another name (IDs are unique).
    Masks the rule refuses raise ``MaskRuleError`` unless ``mask_threshold`` or ``skip_ambiguous`` (cases left out).
    """
    spec = plan.spec
    if mask_threshold is not None and spec.inspect_mask is None:
        raise OptionError(f"--mask_threshold applies to binary masks only: {spec.name}'s labels are read as they are "
                          f"(instance or organ labels)")
    raw_root = require_env_folder("nnUNet_raw")
    prep_root = optional_env_folder("nnUNet_preprocessed")
    name = f"Dataset{dataset_id:03d}_{spec.name}"
    target = raw_root / name
    restore_set_aside(target)  # a conversion killed while replacing target
    _check_target(raw_root, prep_root, name, dataset_id, overwrite)
    _check_source_outside_target(Path(plan.source), target)
    if plan.split_problem:
        raise ConversionError(plan.split_problem)
    if not plan.train and not plan.val and not plan.test:
        raise ConversionError(f"{spec.name}: no cases to convert in {plan.source}")
    for case_id in plan.train + plan.val + plan.test:
        spec.check_case(plan.cases[case_id])
    report = survey_masks(plan, plan.train + plan.val + plan.test, mask_threshold, num_processes, progress)
    if report is not None and report.refused:
        if not skip_ambiguous:
            raise MaskRuleError(report.refusal_message(), report)
        report.left_out = report.refused
        plan = leave_out_cases(plan, report.left_out)
        if not plan.train and not plan.val and not plan.test:
            raise ConversionError(f"{spec.name}: --skip_ambiguous left out every case of {plan.source}")
    splits = [{"train": sorted(plan.train), "val": sorted(plan.val)}] if plan.train and plan.val else None
    prep_splits = prep_root / name / "splits_final.json" if prep_root is not None else None
    stale_splits = _check_preprocessed_splits(splits, prep_splits, overwrite)
    subsets = [(c, "Tr") for c in plan.train + plan.val] + [(c, "Ts") for c in plan.test]
    write_case = spec.write_case if spec.inspect_mask is None else partial(spec.write_case,
                                                                            mask_threshold=mask_threshold)
    masks_record = report.record() if report is not None else None

    partial_dir = None
    try:
        partial_dir = temporary_sibling(target, folder=True)
        _write_cases(plan, write_case, subsets, partial_dir, name, resize, num_processes, progress, masks_record)
        if splits is not None:
            _write_json_atomic(splits, partial_dir / "splits_final.json")
        replace_folder(partial_dir, target)
    except BaseException as err:
        if partial_dir is not None:
            shutil.rmtree(partial_dir, ignore_errors=True)
        if isinstance(err, OSError) and not isinstance(err, ConversionError):
            # disk full, read-only file system, permissions: one line, nothing left behind
            where = str(err.filename or partial_dir or target)
            verb = "write" if where.startswith(str(raw_root)) else "read"
            raise ConversionError(f"cannot {verb} {where}: {err.strerror or err}") from None
        raise

    notes = list(plan.notes)
    written = [target / "splits_final.json"] if splits is not None else []
    written += _place_preprocessed_splits(splits, prep_splits, stale_splits, dataset_id, notes)
    if splits is None and (plan.train or plan.val):
        notes.append("no validation cases: no splits_final.json was written, nnU-Net will draw its own "
                     "5-fold cross-validation")
    return ConversionResult(name, target, written, len(plan.train), len(plan.val), len(plan.test), notes,
                            report.summary_lines() if report is not None else [])


def _check_target(raw_root: Path, prep_root: Optional[Path], name: str, dataset_id: int, overwrite: bool) -> None:
    """Refuse an ID used by a dataset of another name, and an existing target without ``overwrite``."""
    for root in (raw_root, prep_root, optional_env_folder("nnUNet_results")):
        others = sorted(root.glob(f"Dataset{dataset_id:03d}_*")) if root is not None and root.is_dir() else []
        for other in others:
            if other.is_dir() and other.name != name:
                raise ConversionError(f"dataset ID {dataset_id} is already used by {other}: nnU-Net needs unique "
                                      f"IDs, choose another -d or remove that folder")
    target = raw_root / name
    if target.exists() and not overwrite:
        raise ConversionError(f"{target} already exists: pass --overwrite to replace it or choose another -d")


def _check_source_outside_target(source: Path, target: Path) -> None:
    """Refuse a source that is, or lies inside, the dataset folder written (and replaced by ``--overwrite``)."""
    source, out = source.resolve(), target.resolve()
    if source == out or out in source.parents:
        raise ConversionError(f"the source folder {source} is inside {target}, the dataset this conversion writes "
                              f"(and --overwrite replaces): copy the source elsewhere first")


def _check_preprocessed_splits(splits: Optional[List[dict]], prep_splits: Optional[Path], overwrite: bool) -> bool:
    """Refuse to replace a different preprocessed ``splits_final.json`` without ``overwrite``; True where one exists
    that this conversion (no validation set) will remove."""
    if splits is not None and prep_splits is not None and prep_splits.is_file() and not overwrite:
        try:
            same = json.loads(prep_splits.read_text(encoding="utf-8"))[:1] == splits
        except (OSError, ValueError):
            same = False
        if not same:
            raise ConversionError(f"{prep_splits} already exists with a different split: pass --overwrite "
                                  f"to replace it")
    stale_splits = splits is None and prep_splits is not None and prep_splits.is_file()
    if stale_splits and not overwrite:
        raise ConversionError(f"{prep_splits} already exists but this conversion has no validation set: pass "
                              f"--overwrite to remove it")
    return stale_splits


def _write_cases(plan: ConversionPlan, write_case: Callable, subsets: Sequence[tuple], partial_dir: Path, name: str,
                 resize: Optional[int], num_processes: int, progress: bool, masks_record: Optional[dict]) -> None:
    """Every case and ``dataset.json`` into ``partial_dir``; ``masks_record``: the mask report's record."""
    from nnunetv2.dataset_conversion.generate_dataset_json import generate_dataset_json

    spec = plan.spec
    for sub in ("imagesTr", "labelsTr", "imagesTs", "labelsTs"):
        (partial_dir / sub).mkdir(parents=True)
    jobs = [(plan.cases[c], partial_dir / f"images{s}" / f"{c}_0000{spec.file_ending}",
             partial_dir / f"labels{s}" / f"{c}{spec.file_ending}", resize) for c, s in subsets]
    run_in_workers(write_case, jobs, num_processes, progress, name, "case")
    record = {"source": str(Path(plan.source).resolve()), "resize": resize, "split": plan.split_origin,
              "num_train": len(plan.train), "num_val": len(plan.val), "num_test": len(plan.test)}
    description = spec.description
    if masks_record is not None:
        record["masks"] = masks_record
        if masks_record["mask_threshold"] is not None:
            description += f"; masks binarised at values above {masks_record['mask_threshold']:g} (--mask_threshold)"
        if masks_record["left_out"]:
            description += f"; left out for their masks (--skip_ambiguous): {len(masks_record['left_out'])} cases"
    generate_dataset_json(
        str(partial_dir), dict(spec.channel_names), dict(spec.labels),
        num_training_cases=len(plan.train) + len(plan.val), file_ending=spec.file_ending,
        dataset_name=name, reference=spec.reference or None, description=description or None,
        license=spec.licence, converted_by="nnunetv2_meddisseg_convert",
        numTest=len(plan.test),
        meddisseg_conversion=record,
    )


def _place_preprocessed_splits(splits: Optional[List[dict]], prep_splits: Optional[Path], stale_splits: bool,
                               dataset_id: int, notes: List[str]) -> List[Path]:
    """Write (or remove a stale) ``splits_final.json`` in nnUNet_preprocessed; notes go to ``notes``."""
    if splits is not None and prep_splits is None:
        notes.append("nnUNet_preprocessed is not set: splits_final.json was written to the raw folder only; "
                     "nnUNetv2_plan_and_preprocess copies it next to the preprocessed data")
        return []
    if splits is not None:
        if prep_splits.parent.is_dir() and any(p.name != "splits_final.json" for p in prep_splits.parent.iterdir()):
            notes.append(f"{prep_splits.parent} holds preprocessed data of an earlier conversion: rerun "
                         f"nnUNetv2_plan_and_preprocess -d {dataset_id} --clean")
        prep_splits.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(splits, prep_splits)
        return [prep_splits]
    if stale_splits:
        prep_splits.unlink()
        notes.append(f"removed {prep_splits} of an earlier conversion (this one has no validation set)")
    return []
