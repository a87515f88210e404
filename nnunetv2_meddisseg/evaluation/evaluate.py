"""``nnUNetv2_meddisseg_evaluate``: the paper's metrics on a folder of predictions.

With one foreground label (default: {0, 1}) the binary metrics (mIoU, mDSC, Recall, Precision) are reported per
image and as means; with several (Synapse), per-label Dice and HD95 in the TransUNet protocol. The JSON holds
fractions in [0, 1]; HD95 is in voxels, or in the images' physical units with ``--hd95_physical``.
"""
import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.evaluation.metrics import BINARY_METRICS, binary_metrics, mean_and_std, multiclass_dice_hd95
from nnunetv2_meddisseg.files import is_inside, write_atomically

__all__ = [
    "LABEL_FILE_ENDINGS",
    "BINARY_LABELS",
    "file_ending_of",
    "reader_for_file_ending",
    "read_label_map",
    "read_image",
    "load_dataset_json_labels",
    "match_cases",
    "evaluate_folders",
    "is_multiclass_summary",
    "format_summary",
    "save_summary",
    "main",
]

NATURAL_IMAGE_ENDINGS = (".png", ".bmp", ".tif", ".tiff")
SIMPLEITK_ENDINGS = (".nii.gz", ".nrrd", ".mha", ".gipl")
LABEL_FILE_ENDINGS = SIMPLEITK_ENDINGS + NATURAL_IMAGE_ENDINGS
BINARY_LABELS = {"background": 0, "foreground": 1}
METRIC_DISPLAY_NAMES = {"iou": "mIoU", "dice": "mDSC", "recall": "Recall", "precision": "Precision"}


def file_ending_of(file_name: str) -> Optional[str]:
    """The label-image ending of ``file_name`` (``.nii.gz``, ``.png``, ...) or None if it is none of them."""
    lower = file_name.lower()
    for ending in LABEL_FILE_ENDINGS:
        if lower.endswith(ending):
            return file_name[len(file_name) - len(ending):]
    return None


def reader_for_file_ending(file_ending: str):
    """An nnU-Net reader/writer instance for ``file_ending``."""
    if file_ending.lower() in NATURAL_IMAGE_ENDINGS:
        from nnunetv2.imageio.natural_image_reader_writer import NaturalImage2DIO
        return NaturalImage2DIO()
    if file_ending.lower() in SIMPLEITK_ENDINGS:
        from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
        return SimpleITKIO()
    raise ValueError(f"unsupported label file ending {file_ending!r}; expected one of {', '.join(LABEL_FILE_ENDINGS)}")


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def read_label_map(file: str, reader=None) -> Tuple[np.ndarray, Tuple[float, ...]]:
    """Read one label image: ``(labels, spacing)``, integer labels (H, W) for 2D images, (D, H, W) for volumes,
    spacing one value per axis in the same order."""
    if reader is None:
        reader = reader_for_file_ending(file_ending_of(file) or os.path.splitext(file)[1])
    try:
        seg, props = reader.read_seg(file)
    except Exception as e:  # the readers raise anything from OSError to RuntimeError on broken files
        raise ValueError(f"cannot read label image {file}: {_one_line(e)}") from None
    if seg.shape[0] != 1:
        raise ValueError(f"{file} is not a single-channel label image ({seg.shape[0]} channels)")
    arr = seg[0]
    if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.round(arr)):
        raise ValueError(f"{file} holds non-integer values; expected a label map")
    spacing = tuple(float(s) for s in props.get("spacing", (1.0,) * arr.ndim))
    # nnU-Net reads 2D images as (1, H, W) with a dummy spacing (999, ...) on the first axis
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr, spacing = arr[0], spacing[1:]
    return arr.astype(np.int64), spacing


def read_image(file: str) -> np.ndarray:
    """Read one input image for display: (H, W, C) for 2D images, (D, H, W, C) for volumes, float32."""
    reader = reader_for_file_ending(file_ending_of(file) or os.path.splitext(file)[1])
    try:
        img, _ = reader.read_images((file,))
    except Exception as e:
        raise ValueError(f"cannot read image {file}: {_one_line(e)}") from None
    img = np.moveaxis(img, 0, -1)  # channels last
    if img.ndim == 4 and img.shape[0] == 1:
        img = img[0]
    return img.astype(np.float32)


def load_dataset_json_labels(djfile: str) -> Tuple[Dict[str, int], str]:
    """``(labels, file_ending)`` from an nnU-Net ``dataset.json``; region-based labels are refused."""
    if not os.path.isfile(djfile):
        raise FileNotFoundError(f"dataset.json not found: {djfile}")
    try:
        with open(djfile, encoding="utf-8") as f:
            dj = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot parse {djfile}: {e}") from None
    if not isinstance(dj.get("labels"), dict) or "file_ending" not in dj:
        raise ValueError(f"{djfile} lacks 'labels' or 'file_ending'")
    for name, value in dj["labels"].items():  # JSON keys are strings
        if not isinstance(value, int):
            raise ValueError(f"{djfile}: label {name!r} is a region ({value}); region-based labels are not supported")
    return dict(dj["labels"]), str(dj["file_ending"])


def _list_label_files(folder: str, what: str) -> Dict[str, List[str]]:
    """{file_ending: [file names]} of the label images in ``folder``."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{what} folder not found: {folder}")
    by_ending: Dict[str, List[str]] = {}
    for name in sorted(os.listdir(folder)):
        ending = file_ending_of(name)
        if ending is not None and os.path.isfile(os.path.join(folder, name)) and not name.startswith("."):
            by_ending.setdefault(ending, []).append(name)
    return by_ending


def match_cases(ref_dir: str, pred_dir: str, file_ending: Optional[str] = None) -> Tuple[str, List[str]]:
    """Check that both folders hold the same cases with the same ending; returns ``(file_ending, case ids)``."""
    ref_files = _list_label_files(ref_dir, "reference")
    pred_files = _list_label_files(pred_dir, "prediction")
    if file_ending is None:
        if not ref_files:
            raise ValueError(f"reference folder {ref_dir} holds no label images ({', '.join(LABEL_FILE_ENDINGS)})")
        if len(ref_files) > 1:
            raise ValueError(f"reference folder {ref_dir} holds label images with several endings "
                             f"({', '.join(sorted(ref_files))}); pass -djfile to say which one is meant")
        file_ending = next(iter(ref_files))
    elif file_ending not in ref_files:
        found = f"holds {', '.join(sorted(ref_files))} files" if ref_files else "holds no label images"
        raise ValueError(f"reference folder {ref_dir} {found}, but the file ending {file_ending} was declared")
    cases = [n[:-len(file_ending)] for n in ref_files[file_ending]]
    if not pred_files:
        visible = [n for n in os.listdir(pred_dir) if not n.startswith(".")]
        state = "is empty" if not visible else f"holds no label images ({', '.join(LABEL_FILE_ENDINGS)})"
        raise ValueError(f"prediction folder {pred_dir} {state}: expected one {file_ending} file per case of the "
                         f"reference folder {ref_dir} (predict into it first)")
    if file_ending not in pred_files:
        raise ValueError(f"prediction folder {pred_dir} holds {', '.join(sorted(pred_files))} files, but the "
                         f"reference folder {ref_dir} holds {file_ending} files: use the same file ending")
    predicted = {n[:-len(file_ending)] for n in pred_files[file_ending]}
    missing = [c for c in cases if c not in predicted]
    if missing:
        raise ValueError(f"prediction folder {pred_dir} lacks {len(missing)} of {len(cases)} cases, "
                         f"first missing: {missing[0]}{file_ending}")
    extra = sorted(predicted - set(cases))
    if extra:
        raise ValueError(f"prediction folder {pred_dir} holds {len(extra)} case(s) without a reference in {ref_dir}, "
                         f"first: {extra[0]}{file_ending}")
    return file_ending, cases


def _check_values(arr: np.ndarray, allowed: np.ndarray, file: str, declared: bool = True) -> None:
    """Refuse label values outside ``allowed``; ``declared`` (from -djfile / --labels) changes the advice."""
    values = np.unique(arr)
    bad = values[~np.isin(values, allowed)]
    if bad.size:
        shown = ", ".join(str(int(v)) for v in bad[:10]) + (", ..." if bad.size > 10 else "")
        if bad.tolist() == [255] and set(allowed.tolist()) == {0, 1}:
            hint = " (a 0/255 mask? binary labels must be 0/1)"
        elif not declared:
            every = " ".join(str(v) for v in range(int(values.max()) + 1))
            hint = (f" (the default is binary; for a multi-class dataset declare its labels with -djfile "
                    f"dataset.json or --labels {every})")
        else:
            hint = ""
        raise ValueError(f"{file} holds label values {{{shown}}} outside the declared set "
                         f"{{{', '.join(str(int(v)) for v in allowed)}}}{hint}")


def evaluate_folders(ref_dir: str, pred_dir: str, labels: Optional[Mapping[str, int]] = None,
                     file_ending: Optional[str] = None, hd95_physical: bool = False,
                     progress: bool = True) -> dict:
    """Evaluate every case of ``ref_dir`` against the same-named file of ``pred_dir``.

    labels: ``{name: value}`` as in dataset.json (default: background 0, foreground 1). One foreground label
    gives ``{"metric_per_case": [{"case", "iou", "dice", "recall", "precision"}, ...], "mean": {...}, "std": {...}}``,
    several the multi-class (TransUNet) summary ``{"labels": {name: value}, "metric_per_case": [{"case", "dice",
    "hd95", "per_label": {name: {"dice", "hd95"}}}, ...], "mean": {"dice", "hd95", "per_label": ...}, "std": {"dice",
    "hd95"}}``, a case's dice/hd95 being its mean over labels and ``mean`` the mean over cases.
    """
    declared = labels is not None
    labels = dict(BINARY_LABELS if labels is None else labels)
    allowed = np.array(sorted(set(labels.values())), dtype=np.int64)
    foreground = {name: v for name, v in sorted(labels.items(), key=lambda kv: kv[1]) if v != 0}
    if not foreground:
        raise ValueError("the declared labels contain no foreground label")
    file_ending, cases = match_cases(ref_dir, pred_dir, file_ending)
    reader = reader_for_file_ending(file_ending)
    multiclass = len(foreground) > 1
    per_case = []
    for case in tqdm(cases, desc=f"evaluating {os.path.basename(os.path.normpath(pred_dir))}",
                     disable=None if progress else True, leave=False):
        ref_file = os.path.join(ref_dir, case + file_ending)
        pred_file = os.path.join(pred_dir, case + file_ending)
        ref, spacing = read_label_map(ref_file, reader)
        pred, _ = read_label_map(pred_file, reader)
        if ref.shape != pred.shape:
            raise ValueError(f"{pred_file} has shape {pred.shape}, its reference {ref_file} has {ref.shape}")
        _check_values(ref, allowed, ref_file, declared)
        _check_values(pred, allowed, pred_file, declared)
        if multiclass:
            scores = multiclass_dice_hd95(pred, ref, foreground.values(), spacing if hd95_physical else None)
            per_label = {name: scores[v] for name, v in foreground.items()}
            per_case.append({"case": case,
                             "dice": float(np.mean([s["dice"] for s in per_label.values()])),
                             "hd95": float(np.mean([s["hd95"] for s in per_label.values()])),
                             "per_label": per_label})
        else:
            fg_value = next(iter(foreground.values()))
            per_case.append({"case": case, **binary_metrics(pred == fg_value, ref == fg_value)})
    mean, std = {}, {}
    for m in ("dice", "hd95") if multiclass else BINARY_METRICS:
        mean[m], std[m] = mean_and_std([c[m] for c in per_case])
    if not multiclass:
        return {"metric_per_case": per_case, "mean": mean, "std": std}
    mean["per_label"] = {name: {m: mean_and_std([c["per_label"][name][m] for c in per_case])[0]
                                for m in ("dice", "hd95")} for name in foreground}
    return {"labels": labels, "metric_per_case": per_case, "mean": mean, "std": std,
            "hd95_unit": "physical" if hd95_physical else "voxel"}


def is_multiclass_summary(summary: Mapping) -> bool:
    """True for a summary from the multi-class (TransUNet) protocol."""
    return "per_label" in summary["mean"]


def format_summary(summary: Mapping) -> str:
    """Human-readable table of a summary: percent with one decimal, mean +- std."""
    lines = [f"{len(summary['metric_per_case'])} cases"]
    if is_multiclass_summary(summary):
        unit = "voxels" if summary.get("hd95_unit", "voxel") == "voxel" else "physical units"
        lines.append(f"{'label':<16} {'Dice (%)':>9} {'HD95 (' + unit + ')':>22}")
        for name, s in summary["mean"]["per_label"].items():
            lines.append(f"{name:<16} {100 * s['dice']:>9.1f} {s['hd95']:>22.2f}")
        lines.append(f"{'mean':<16} {100 * summary['mean']['dice']:>9.1f} {summary['mean']['hd95']:>22.2f}"
                     f"   (std over cases: Dice {100 * summary['std']['dice']:.1f}, HD95 {summary['std']['hd95']:.2f})")
    else:
        for m in BINARY_METRICS:
            mean, std = 100 * summary["mean"][m], 100 * summary["std"][m]
            lines.append(f"{METRIC_DISPLAY_NAMES[m]:<10} {mean:5.1f} +- {std:.1f} %")
    return "\n".join(lines)


def check_output_file(output_file: str, inputs: Mapping[str, Optional[str]]) -> None:
    """Refuse an ``-o`` that is one of the ``inputs`` (option -> path), lies inside one, or is a folder."""
    for option, path in inputs.items():
        if path is not None and is_inside(output_file, path):
            raise UserError(f"-o {output_file} is inside {option} {path}: the summary would be written into the "
                            f"input; choose a file outside it")
    if os.path.isdir(output_file):
        raise UserError(f"-o {output_file} is a folder: name the summary file, e.g. "
                        f"{os.path.join(output_file, 'summary.json')}")


def save_summary(summary: Mapping, output_file: str) -> None:
    """Write a summary as JSON, whole or not at all; a failed write raises a ``UserError`` naming the file."""
    def write(partial: Path) -> None:
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)

    try:
        os.makedirs(os.path.dirname(os.path.abspath(output_file)), exist_ok=True)
        write_atomically(Path(output_file), write)
    except OSError as e:
        raise UserError(f"cannot write the summary {output_file}: {e.strerror or e}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nnUNetv2_meddisseg_evaluate", formatter_class=DefaultsHelpFormatter,
        description="Med-DisSeg paper metrics (mIoU, mDSC, Recall, Precision per image; per-organ Dice/HD95 "
                    "for multi-class datasets) of a prediction folder against a label folder.")
    p.add_argument("-ref", required=True, help="folder with the reference label images (e.g. labelsTs)")
    p.add_argument("-pred", required=True, help="folder with the predicted label images (same names)")
    p.add_argument("-o", default=None,
                   help="write the summary JSON here (fractions in [0, 1]; default: print the table only)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-djfile", default=None,
                   help="dataset.json: its labels and file_ending are used; needed for multi-class datasets such as "
                        "Synapse (default: binary labels 0 1)")
    g.add_argument("--labels", type=int, nargs="+", default=None,
                   help="declared label values incl. background (default: 0 1); more than one foreground "
                        "label switches to per-label Dice/HD95")
    p.add_argument("--hd95_physical", action="store_true",
                   help="HD95 in the images' physical spacing instead of voxels (TransUNet reports voxels)")
    return p


def _evaluate_command(argv: Optional[Sequence[str]]) -> None:
    args = _parser().parse_args(argv)
    labels, file_ending = None, None
    if args.djfile is not None:
        labels, file_ending = load_dataset_json_labels(args.djfile)
    elif args.labels is not None:
        labels = {("background" if v == 0 else f"label_{v}"): v for v in sorted(set(args.labels))}
    if args.o is not None:
        check_output_file(args.o, {"-ref": args.ref, "-pred": args.pred, "-djfile": args.djfile})
    summary = evaluate_folders(args.ref, args.pred, labels, file_ending, args.hd95_physical)
    if args.o is not None:
        save_summary(summary, args.o)
    print(format_summary(summary))
    if args.o is not None:
        print(f"summary written to {args.o}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; returns the exit code (0, or 2 after a one-line error: see ``cli``)."""
    return run_command("nnUNetv2_meddisseg_evaluate", _evaluate_command, argv,
                       user_errors=(UserError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
