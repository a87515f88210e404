"""``nnUNetv2_meddisseg_compare``: default nnU-Net vs Med-DisSeg on a dataset's test set.

Both models come from ``$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG/fold_F/``. Each predicts
``imagesTs`` (only cases missing from ``OUT/predictions/TRAINER__PLANS__CONFIG``); both are evaluated against
``labelsTs`` with the paper's metrics. ``OUT`` receives:

- ``comparison.md`` / ``.csv``: one row per model (mean and std in percent), plus the paper's Med-DisSeg numbers
  where it reports the dataset; ``comparison_bar_chart.png``; ``summary_<model>.json`` per model;
- ``paired_differences.csv``: per case both models' scores and their difference (second minus first);
- ``statistics.json``: the Wilcoxon signed-rank p-value per metric (scipy's default two-sided test, zero
  differences dropped; all differences zero gives p = 1 and a note);
- ``overlays/*.png``: image | ground truth | both predictions for the cases whose Dice differs most.
"""
import argparse
import os
import sys
from typing import Optional, Sequence, Tuple

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, add_device_argument, resolve_device, run_command
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.evaluation.compare_predictions import compare_prediction_folders, terminal_text
from nnunetv2_meddisseg.evaluation.evaluate import load_dataset_json_labels
from nnunetv2_meddisseg.evaluation.nnunet_prediction import find_trained_model, predict_missing_cases
from nnunetv2_meddisseg.files import is_inside

__all__ = ["main"]

PROG = "nnUNetv2_meddisseg_compare"


def _default_names(baseline_trainer: str, trainer: str, folders: Sequence[str]) -> Tuple[str, str]:
    a = "nnU-Net" if baseline_trainer == "nnUNetTrainer" else baseline_trainer
    b = "Med-DisSeg" if trainer == "nnUNetTrainerMedDisSeg" else trainer
    return (a, b) if a != b else tuple(os.path.basename(f) for f in folders)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=DefaultsHelpFormatter,
        description="Predict a dataset's imagesTs with a default nnU-Net model and a Med-DisSeg model, evaluate "
                    "both against labelsTs with the paper's metrics and write a side-by-side table, a bar chart, "
                    "paired differences with a Wilcoxon test and overlays.")
    p.add_argument("-d", required=True, help="dataset ID or name (DatasetXXX_Name)")
    p.add_argument("-f", default="0", help="fold of both models ('all' allowed)")
    p.add_argument("-c", default="2d", help="configuration of both models")
    p.add_argument("--baseline_trainer", default="nnUNetTrainer", help="trainer of the default nnU-Net model")
    p.add_argument("--baseline_plans", default="nnUNetPlans", help="plans of the default nnU-Net model")
    p.add_argument("--trainer", default="nnUNetTrainerMedDisSeg", help="trainer of the Med-DisSeg model")
    p.add_argument("--plans", default=None,
                   help="plans of the Med-DisSeg model (default: nnUNetMedDisSegPlans if trained, else nnUNetPlans)")
    p.add_argument("--checkpoint", default="checkpoint_final.pth", help="checkpoint file of both models")
    add_device_argument(p, what="device to predict on")
    p.add_argument("-npp", type=int, default=0,
                   help="processes for nnU-Net's pre-processing/export (0: sequential, in this process)")
    p.add_argument("--overwrite", action="store_true", help="predict again even where predictions exist")
    p.add_argument("--num_overlays", type=int, default=4,
                   help="overlay pictures of the cases where the two models differ most")
    p.add_argument("--names", nargs=2, default=None, metavar=("BASELINE", "MODEL"),
                   help="row names (default: nnU-Net and Med-DisSeg for the default trainers, else the trainer names)")
    p.add_argument("-o", default=None,
                   help="output folder (default: $nnUNet_results/DatasetXXX_Name/meddisseg_compare_<config>_fold_<f>)")
    return p


def _dataset_name(dataset: str) -> str:
    """``DatasetXXX_Name`` of ``-d`` (an ID or a name), with the nnU-Net folders checked first."""
    from nnunetv2.paths import nnUNet_raw, nnUNet_results
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    for var in (nnUNet_raw, nnUNet_results):
        if not var.is_set():
            raise UserError(f"the environment variable {var.env_var_name} is not set")
    try:
        return maybe_convert_to_dataset_name(dataset)
    except (RuntimeError, ValueError) as e:
        if str(e).startswith("Could not find a dataset"):
            raise UserError(f"-d {dataset}: no dataset with this ID in nnUNet_raw ({nnUNet_raw.get()}), "
                            f"nnUNet_preprocessed or nnUNet_results") from None
        raise UserError(f"-d {dataset}: {str(e).splitlines()[0]}") from None


def _compare_command(argv: Optional[Sequence[str]]) -> None:
    from nnunetv2.paths import nnUNet_raw, nnUNet_results

    from nnunetv2_meddisseg.torch_files import check_model_folder_checkpoints

    args = _parser().parse_args(argv)
    for option, value in (("-npp", args.npp), ("--num_overlays", args.num_overlays)):
        if value < 0:
            raise UserError(f"{option} must be 0 or more, got {value}")
    dataset_name = _dataset_name(args.d)
    raw = os.path.join(nnUNet_raw.get(), dataset_name)
    labels, file_ending = load_dataset_json_labels(os.path.join(raw, "dataset.json"))
    images_ts, labels_ts = os.path.join(raw, "imagesTs"), os.path.join(raw, "labelsTs")
    for folder in (images_ts, labels_ts):
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"{folder} not found: the comparison needs the test set with labels")
    args.device = resolve_device(args.device)
    plans_b = [args.plans] if args.plans else ["nnUNetMedDisSegPlans", "nnUNetPlans"]
    models = [(args.baseline_trainer, [args.baseline_plans]), (args.trainer, plans_b)]
    folders = [find_trained_model(dataset_name, t, p, args.c, args.f, args.checkpoint) for t, p in models]
    for folder in folders:  # before nnU-Net's predictor loads them, unsafely
        check_model_folder_checkpoints(folder, [args.f], args.checkpoint)
    out = args.o or os.path.join(nnUNet_results.get(), dataset_name, f"meddisseg_compare_{args.c}_fold_{args.f}")
    for folder in (images_ts, labels_ts, *folders):  # -o must not be an input folder or lie inside one
        if is_inside(out, folder):
            raise UserError(f"-o {out} is inside the input folder {folder}: the comparison would be written into "
                            f"its input; choose a folder outside it")
    pred_dirs = []
    for folder in folders:
        pred_dir = os.path.join(out, "predictions", os.path.basename(folder))
        done = predict_missing_cases(folder, args.f, args.checkpoint, images_ts, file_ending, pred_dir,
                                     args.device, args.npp, args.overwrite)
        print(f"{os.path.basename(folder)}: predicted {len(done)} case(s) into {pred_dir}")
        pred_dirs.append(pred_dir)
    names = args.names or _default_names(args.baseline_trainer, args.trainer, folders)
    result = compare_prediction_folders(labels_ts, pred_dirs[0], pred_dirs[1], out, image_dir=images_ts,
                                        names=names, paper_key=dataset_name, labels=labels,
                                        file_ending=file_ending, num_overlays=args.num_overlays,
                                        title=f"{dataset_name}, {args.c}, fold {args.f}")
    _print_result_files(result["files"])


def _print_result_files(files: dict) -> None:
    with open(files["table_md"], encoding="utf-8") as f:
        print(terminal_text(f.read()))
    print(f"report (tables and overlays): {files['table_md']}")
    print(f"table: {files['table_csv']}")
    print(f"bar chart: {files['chart']}")
    print(f"paired differences: {files['differences_csv']}, statistics: {files['statistics']}")
    if files["overlays"]:
        print(f"overlays: {os.path.dirname(files['overlays'][0])}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; returns the exit code (0, or 2 after a one-line error: see ``cli``)."""
    return run_command(PROG, _compare_command, argv, user_errors=(UserError, ValueError, OSError))


if __name__ == "__main__":
    sys.exit(main())
