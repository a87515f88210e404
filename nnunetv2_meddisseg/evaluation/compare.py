"""``nnUNetv2_meddisseg_compare``: default nnU-Net vs Med-DisSeg on a dataset's test set.

    nnUNetv2_meddisseg_compare -d ID [-f FOLD] [-c 2d] [--baseline-trainer nnUNetTrainer]
        [--baseline-plans nnUNetPlans] [--trainer nnUNetTrainerMedDisSeg] [--plans PLANS]
        [--checkpoint checkpoint_final.pth] [--device cpu|cuda] [-npp N] [--overwrite]
        [--names BASELINE MODEL] [--num-overlays K] [-o OUT]

Both models are read from ``$nnUNet_results/DatasetXXX_Name/TRAINER__PLANS__CONFIG/fold_F/``; the
test images ``$nnUNet_raw/DatasetXXX_Name/imagesTs`` are predicted with each (only cases without a
prediction in ``OUT/predictions/TRAINER__PLANS__CONFIG``), both are evaluated against ``labelsTs``
with the paper's metrics, and ``OUT`` receives:

- ``comparison.md`` / ``comparison.csv``: one row per model (mean and std in percent) and, where the
  paper reports the dataset, its Med-DisSeg numbers as a reference row;
- ``comparison_bar_chart.png``;
- ``paired_differences.csv``: per case the scores of both models and their difference (second minus
  first), ``statistics.json``: the Wilcoxon signed-rank p-value per metric (scipy's default
  two-sided test, zero differences dropped; all differences zero gives p = 1 and a note);
- ``overlays/*.png``: image | ground truth | both predictions for the cases whose Dice differs most;
- ``summary_<model>.json``: each model's evaluation summary.

:func:`compare_prediction_folders` does everything after the prediction step.
"""
import argparse
import contextlib
import csv
import json
import os
import re
import sys
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import stats
from tqdm import tqdm

from nnunetv2_meddisseg.cli import print_error
from nnunetv2_meddisseg.evaluation.evaluate import (METRIC_DISPLAY_NAMES, evaluate_folders, is_multiclass_summary,
                                                    load_dataset_json_labels, match_cases, read_image,
                                                    read_label_map, save_summary)
from nnunetv2_meddisseg.evaluation.metrics import BINARY_METRICS
from nnunetv2_meddisseg.evaluation.plots import bar_chart, most_different_slice, overlay_figure

__all__ = [
    "normalise_name",
    "load_paper_results",
    "paper_reference",
    "wilcoxon_p_value",
    "paired_differences",
    "compare_prediction_folders",
    "model_folder",
    "predict_missing_cases",
    "main",
]

PAPER_RESULTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_results.json")


def normalise_name(name: str) -> str:
    """Lower-case alphanumerics without an nnU-Net ``DatasetXXX_`` prefix: 'Dataset501_Kvasir-SEG' -> 'kvasirseg'."""
    name = re.sub(r"^Dataset\d{3}_", "", str(name))
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _organ_key(name: str) -> Tuple[str, str]:
    tokens = [t for t in re.split(r"[^0-9a-z]+", name.lower()) if t]
    return "".join(tokens), "".join(sorted(tokens))


def load_paper_results(path: str = PAPER_RESULTS_FILE) -> Dict[str, dict]:
    """The paper's Med-DisSeg results, ``{dataset key: {"metrics": {metric: percent}, ...}}``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def paper_reference(dataset_name: Optional[str]) -> Optional[Tuple[str, dict]]:
    """``(key, entry)`` of the paper's results for a dataset name or key, matched on :func:`normalise_name`."""
    if not dataset_name:
        return None
    wanted = normalise_name(dataset_name)
    for key, entry in load_paper_results().items():
        if normalise_name(key) == wanted:
            return key, entry
    return None


def wilcoxon_p_value(differences: Sequence[float]) -> Tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p-value of paired differences, and a note ('' if none).

    All-zero differences give ``(1.0, note)``; fewer than one non-zero difference or a scipy
    failure give ``(nan, note)``.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        return float("nan"), "no cases"
    if np.all(d == 0):
        return 1.0, "all paired differences are zero"
    try:
        return float(stats.wilcoxon(d).pvalue), ""
    except ValueError as e:
        return float("nan"), f"wilcoxon failed: {e}"


def _metrics_of(summary: Mapping) -> List[str]:
    return ["dice", "hd95"] if is_multiclass_summary(summary) else list(BINARY_METRICS)


def paired_differences(summary_a: Mapping, summary_b: Mapping, names: Sequence[str]) -> List[Dict]:
    """Per-case rows ``{"case", "<metric>_<name a>", "<metric>_<name b>", "<metric>_diff" (b - a)}``, sorted by case."""
    metrics = _metrics_of(summary_a)
    a = {c["case"]: c for c in summary_a["metric_per_case"]}
    b = {c["case"]: c for c in summary_b["metric_per_case"]}
    if set(a) != set(b):
        raise ValueError("the two summaries cover different cases")
    rows = []
    for case in sorted(a):
        row = {"case": case}
        for m in metrics:
            row[f"{m}_{names[0]}"] = a[case][m]
            row[f"{m}_{names[1]}"] = b[case][m]
            row[f"{m}_diff"] = b[case][m] - a[case][m]
        rows.append(row)
    return rows


def _table_rows(summaries: Sequence[Tuple[str, Mapping]],
                paper: Optional[Tuple[str, dict]]) -> Tuple[List[str], List[Dict]]:
    """(columns, rows) of the comparison table; values in percent (HD95 as is)."""
    first = summaries[0][1]
    if is_multiclass_summary(first):
        organs = list(first["mean"]["per_label"])
        columns = [f"dice:{o}" for o in organs] + ["dice", "hd95"]
    else:
        organs = []
        columns = list(BINARY_METRICS)
    scale = {c: (1.0 if c == "hd95" else 100.0) for c in columns}
    rows = []
    for name, s in summaries:
        values, std = {}, {}
        for c in columns:
            if c.startswith("dice:"):
                values[c] = scale[c] * s["mean"]["per_label"][c[5:]]["dice"]
            else:
                values[c] = scale[c] * s["mean"][c]
                std[c] = scale[c] * s["std"][c]
        rows.append({"name": name, "source": "this run", "n_cases": len(s["metric_per_case"]),
                     "values": values, "std": std})
    if paper is not None:
        key, entry = paper
        values = {c: entry["metrics"].get(c) for c in columns if not c.startswith("dice:")}
        paper_organs = {_organ_key(o): v for o, v in entry.get("per_label_dice", {}).items()}
        for o in organs:
            k = _organ_key(o)
            same_words = next((v for pk, v in paper_organs.items() if pk[1] == k[1]), None)  # 'kidney_left'
            values[f"dice:{o}"] = paper_organs.get(k, same_words)
        rows.append({"name": f"Med-DisSeg (paper, {key})", "source": entry.get("source", "paper"), "n_cases": None,
                     "values": values, "std": {}})
    return columns, rows


def _column_title(c: str) -> str:
    if c.startswith("dice:"):
        return f"{c[5:]} DSC (%)"
    if c == "hd95":
        return "HD95"
    return f"{METRIC_DISPLAY_NAMES[c]} (%)"


def _fmt(v: Optional[float], digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.{digits}f}"


def _write_csv(path: str, fieldnames: Sequence[str], rows: Sequence[Mapping]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fieldnames})


def _slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z._-]+", "_", name).strip("_") or "model"


def _case_image(image_dir: Optional[str], case: str, file_ending: str) -> Optional[np.ndarray]:
    if image_dir is None:
        return None
    f = os.path.join(image_dir, f"{case}_0000{file_ending}")
    return read_image(f) if os.path.isfile(f) else None


def compare_prediction_folders(ref_dir: str, pred_a: str, pred_b: str, out_dir: str,
                               image_dir: Optional[str] = None,
                               names: Sequence[str] = ("nnU-Net", "Med-DisSeg"),
                               paper_key: Optional[str] = None,
                               labels: Optional[Mapping[str, int]] = None,
                               file_ending: Optional[str] = None,
                               num_overlays: int = 4,
                               title: Optional[str] = None,
                               progress: bool = True) -> dict:
    """Evaluate two prediction folders against ``ref_dir`` and write the comparison into ``out_dir``.

    image_dir: folder with the input images (``CASE_0000<ending>``) for the overlays (grey
    background without it); paper_key: dataset name or key of ``paper_results.json`` for the
    reference row; labels: ``{name: value}`` as in dataset.json (default binary). Returns
    ``{"summaries": {name: summary}, "columns", "table", "differences", "statistics", "paper_key",
    "files": {...}}``.
    """
    if len(names) != 2 or names[0] == names[1]:
        raise ValueError(f"names must be two different model names, got {list(names)}")
    ending, _ = match_cases(ref_dir, pred_a, file_ending)
    os.makedirs(out_dir, exist_ok=True)
    summaries = [(n, evaluate_folders(ref_dir, p, labels, ending, progress=progress))
                 for n, p in zip(names, (pred_a, pred_b))]
    files: Dict[str, object] = {}
    for n, s in summaries:
        files[f"summary_{n}"] = os.path.join(out_dir, f"summary_{_slug(n)}.json")
        save_summary(s, files[f"summary_{n}"])

    paper = paper_reference(paper_key)
    columns, table = _table_rows(summaries, paper)
    metrics = _metrics_of(summaries[0][1])
    differences = paired_differences(summaries[0][1], summaries[1][1], names)
    statistics = {"comparison": f"{names[1]} - {names[0]}", "n_cases": len(differences), "test":
                  "scipy.stats.wilcoxon, two-sided, zero differences dropped", "metrics": {}}
    for m in metrics:
        d = np.array([r[f"{m}_diff"] for r in differences], dtype=np.float64)
        p, note = wilcoxon_p_value(d)
        better = int(np.sum(d < 0)) if m == "hd95" else int(np.sum(d > 0))
        worse = int(np.sum(d > 0)) if m == "hd95" else int(np.sum(d < 0))
        statistics["metrics"][m] = {"p_value": p, "note": note, "mean_difference": float(np.mean(d)),
                                    "median_difference": float(np.median(d)), "n_better": better,
                                    "n_worse": worse, "n_tied": int(np.sum(d == 0))}

    # tables
    csv_fields = ["method", "source", "n_cases"]
    for c in columns:
        csv_fields += [c] if c.startswith("dice:") else [c, f"{c}_std"]
    csv_rows = []
    for r in table:
        row = {"method": r["name"], "source": r["source"], "n_cases": r["n_cases"]}
        for c in columns:
            v = r["values"].get(c)
            row[c] = None if v is None else round(float(v), 4)
            if not c.startswith("dice:"):
                s = r["std"].get(c)
                row[f"{c}_std"] = None if s is None else round(float(s), 4)
        csv_rows.append(row)
    files["table_csv"] = os.path.join(out_dir, "comparison.csv")
    _write_csv(files["table_csv"], csv_fields, csv_rows)

    n_cases = len(differences)
    heading = title or f"Comparison on {os.path.abspath(ref_dir)}"
    md = [f"# {heading}", "", f"{n_cases} test cases; mean ± standard deviation over cases "
          f"(Dice-type scores in percent{', HD95 in voxels' if 'hd95' in columns else ''}).", "",
          "| Method | " + " | ".join(_column_title(c) for c in columns) + " |",
          "|---|" + "---|" * len(columns)]
    for r in table:
        cells = []
        for c in columns:
            v, s = r["values"].get(c), r["std"].get(c)
            digits = 2 if c == "hd95" else 1
            cells.append(_fmt(v, digits) + ("" if s is None else f" ± {_fmt(s, digits)}"))
        md.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    if paper is None:
        md += ["", "The paper reports no results for this dataset (no reference row)."]
    md += ["", f"## Paired differences ({names[1]} − {names[0]}), Wilcoxon signed-rank test", "",
           "| Metric | mean diff | median diff | better / worse / tied | p-value |", "|---|---|---|---|---|"]
    for m in metrics:
        st = statistics["metrics"][m]
        scale = 1.0 if m == "hd95" else 100.0
        p_txt = _fmt(st["p_value"], 4) if st["p_value"] >= 1e-4 else f"{st['p_value']:.1e}"
        note = f" ({st['note']})" if st["note"] else ""
        md.append(f"| {_column_title(m)} | {scale * st['mean_difference']:+.2f} "
                  f"| {scale * st['median_difference']:+.2f}"
                  f" | {st['n_better']} / {st['n_worse']} / {st['n_tied']} | {p_txt}{note} |")
    files["table_md"] = os.path.join(out_dir, "comparison.md")

    # differences, statistics, chart
    files["differences_csv"] = os.path.join(out_dir, "paired_differences.csv")
    _write_csv(files["differences_csv"], list(differences[0].keys()) if differences else ["case"], differences)
    files["statistics"] = os.path.join(out_dir, "statistics.json")
    with open(files["statistics"], "w", encoding="utf-8") as f:
        json.dump(statistics, f, indent=2)
    chart_cols = [c for c in columns if c != "hd95"]
    files["chart"] = os.path.join(out_dir, "comparison_bar_chart.png")
    bar_chart([{"name": r["name"], "values": {c: r["values"].get(c) for c in chart_cols},
                "std": {c: r["std"].get(c) for c in chart_cols}} for r in table],
              chart_cols, files["chart"], title=title or "", ylabel="score (%)",
              metric_labels={c: _column_title(c).replace(" (%)", "") for c in chart_cols})

    # overlays of the cases whose Dice differs most
    ranked = sorted((r for r in differences if r["dice_diff"] != 0), key=lambda r: -abs(r["dice_diff"]))
    ranked = ranked[:max(num_overlays, 0)]
    overlay_dir = os.path.join(out_dir, "overlays")
    overlays = []
    if ranked:
        os.makedirs(overlay_dir, exist_ok=True)
        for r in tqdm(ranked, desc="overlays", disable=None if progress else True, leave=False):
            case = r["case"]
            ref, _ = read_label_map(os.path.join(ref_dir, case + ending))
            preds = [read_label_map(os.path.join(p, case + ending))[0] for p in (pred_a, pred_b)]
            image = _case_image(image_dir, case, ending)
            case_title = f"{case}: {names[1]} − {names[0]} Dice {100 * r['dice_diff']:+.1f}"
            if ref.ndim == 3:
                z = most_different_slice(ref, preds)
                ref, preds = ref[z], [p[z] for p in preds]
                image = None if image is None else image[z]
                case_title += f" (slice {z})"
            out_file = os.path.join(overlay_dir, f"{_slug(case)}.png")
            overlay_figure(image, ref, preds, names, out_file, title=case_title,
                           scores=[r[f"dice_{names[0]}"], r[f"dice_{names[1]}"]])
            overlays.append(out_file)
        md += ["", "## Cases that differ most", ""] + [f"![{os.path.basename(o)}](overlays/{os.path.basename(o)})"
                                                         for o in overlays]
    files["overlays"] = overlays
    with open(files["table_md"], "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return {"summaries": dict(summaries), "columns": columns, "table": table, "differences": differences,
            "statistics": statistics, "paper_key": None if paper is None else paper[0], "files": files}


# ------------------------------------------------------------------------------------------------
# prediction with trained nnU-Net models


def model_folder(dataset_name: str, trainer: str, plans: str, configuration: str) -> str:
    """``$nnUNet_results/<dataset>/<trainer>__<plans>__<configuration>``."""
    from nnunetv2.paths import nnUNet_results
    return os.path.join(nnUNet_results.require(), dataset_name, f"{trainer}__{plans}__{configuration}")


def _resolve_model(dataset_name: str, trainer: str, plans: Optional[Sequence[str]], configuration: str,
                   fold: str, checkpoint: str) -> str:
    tried = []
    for p in plans:
        folder = model_folder(dataset_name, trainer, p, configuration)
        ckpt = os.path.join(folder, f"fold_{fold}", checkpoint)
        if os.path.isfile(ckpt):
            return folder
        tried.append(ckpt)
    raise FileNotFoundError(f"no trained model: {' nor '.join(tried)} exists (train it first, or pick another "
                            f"--checkpoint such as checkpoint_best.pth)")


def _ensure_ext_trainer_path() -> None:
    # let nnU-Net find nnUNetTrainerMedDisSeg when the user has not set nnUNet_extTrainer
    if os.environ.get("nnUNet_extTrainer"):
        return
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nnunet_trainers")
    if os.path.isdir(folder):
        os.environ["nnUNet_extTrainer"] = folder


def predict_missing_cases(model_dir: str, fold: str, checkpoint: str, images_dir: str, file_ending: str,
                          output_dir: str, device: str = "cpu", num_processes: int = 0,
                          overwrite: bool = False, progress: bool = True) -> List[str]:
    """Predict every case of ``images_dir`` that has no ``<case><ending>`` in ``output_dir`` yet.

    Uses nnU-Net's ``nnUNetPredictor`` (``initialize_from_trained_model_folder`` and
    ``predict_from_files_sequential`` case by case with ``num_processes`` 0, ``predict_from_files``
    otherwise); nnU-Net's own console output goes to ``output_dir/predict_log.txt``. Returns the
    predicted case ids.
    """
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    if not os.path.isdir(images_dir):
        raise FileNotFoundError(f"test image folder not found: {images_dir}")
    lists = create_lists_from_splitted_dataset_folder(images_dir, file_ending)
    if not lists:
        raise ValueError(f"{images_dir} holds no images ending in _0000{file_ending}")
    cases = [os.path.basename(fs[0])[:-(len(file_ending) + 5)] for fs in lists]
    todo = [(c, fs) for c, fs in zip(cases, lists)
            if overwrite or not os.path.isfile(os.path.join(output_dir, c + file_ending))]
    if not todo:
        return []
    import torch  # heavy imports only when something is to be predicted
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    os.makedirs(output_dir, exist_ok=True)
    _ensure_ext_trainer_path()
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA device is available")
    log_file = os.path.join(output_dir, "predict_log.txt")
    with open(log_file, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=True,
                                    perform_everything_on_device=dev.type == "cuda", device=dev,
                                    verbose=False, allow_tqdm=False)
        predictor.initialize_from_trained_model_folder(model_dir, (fold if fold == "all" else int(fold),),
                                                       checkpoint_name=checkpoint)
        outputs = [os.path.join(output_dir, c) for c, _ in todo]
        if num_processes > 0:
            predictor.predict_from_files([fs for _, fs in todo], outputs, overwrite=True,
                                         num_processes_preprocessing=num_processes,
                                         num_processes_segmentation_export=num_processes)
        else:
            for (c, fs), o in tqdm(list(zip(todo, outputs)), desc=f"predicting {os.path.basename(model_dir)}",
                                   disable=None if progress else True, file=sys.stderr):
                predictor.predict_from_files_sequential([fs], [o], overwrite=True)
    return [c for c, _ in todo]


def _default_names(baseline_trainer: str, trainer: str, folders: Sequence[str]) -> Tuple[str, str]:
    a = "nnU-Net" if baseline_trainer == "nnUNetTrainer" else baseline_trainer
    b = "Med-DisSeg" if trainer == "nnUNetTrainerMedDisSeg" else trainer
    return (a, b) if a != b else tuple(os.path.basename(f) for f in folders)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nnUNetv2_meddisseg_compare",
        description="Predict a dataset's imagesTs with a default nnU-Net model and a Med-DisSeg model, evaluate "
                    "both against labelsTs with the paper's metrics and write a side-by-side table, a bar chart, "
                    "paired differences with a Wilcoxon test and overlays.")
    p.add_argument("-d", required=True, help="dataset ID or name (DatasetXXX_Name)")
    p.add_argument("-f", default="0", help="fold (default 0; 'all' allowed)")
    p.add_argument("-c", default="2d", help="configuration (default 2d)")
    p.add_argument("--baseline-trainer", default="nnUNetTrainer")
    p.add_argument("--baseline-plans", default="nnUNetPlans")
    p.add_argument("--trainer", default="nnUNetTrainerMedDisSeg")
    p.add_argument("--plans", default=None,
                   help="plans of the Med-DisSeg model (default: nnUNetMedDisSegPlans if trained, else nnUNetPlans)")
    p.add_argument("--checkpoint", default="checkpoint_final.pth")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: cuda if available")
    p.add_argument("-npp", type=int, default=0,
                   help="processes for nnU-Net's pre-processing/export (0: sequential, in this process)")
    p.add_argument("--overwrite", action="store_true", help="predict again even where predictions exist")
    p.add_argument("--num-overlays", type=int, default=4)
    p.add_argument("--names", nargs=2, default=None, metavar=("BASELINE", "MODEL"),
                   help="row names (default: nnU-Net and Med-DisSeg for the default trainers, else the trainer names)")
    p.add_argument("-o", default=None,
                   help="output folder (default: $nnUNet_results/DatasetXXX_Name/meddisseg_compare_<config>_fold_<f>)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from nnunetv2.paths import nnUNet_raw, nnUNet_results
        for var in (nnUNet_raw, nnUNet_results):
            if not var.is_set():
                raise ValueError(f"the environment variable {var.env_var_name} is not set")
        from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name
        try:
            dataset_name = maybe_convert_to_dataset_name(args.d)
        except (RuntimeError, ValueError) as e:
            if str(e).startswith("Could not find a dataset"):
                raise ValueError(f"-d {args.d}: no dataset with this ID in nnUNet_raw ({nnUNet_raw.get()}), "
                                 f"nnUNet_preprocessed or nnUNet_results") from None
            raise ValueError(f"-d {args.d}: {str(e).splitlines()[0]}") from None
        raw = os.path.join(nnUNet_raw.get(), dataset_name)
        labels, file_ending = load_dataset_json_labels(os.path.join(raw, "dataset.json"))
        images_ts, labels_ts = os.path.join(raw, "imagesTs"), os.path.join(raw, "labelsTs")
        for folder in (images_ts, labels_ts):
            if not os.path.isdir(folder):
                raise FileNotFoundError(f"{folder} not found: the comparison needs the test set with labels")
        if args.device is None:
            import torch
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        plans_b = [args.plans] if args.plans else ["nnUNetMedDisSegPlans", "nnUNetPlans"]
        models = [(args.baseline_trainer, [args.baseline_plans]), (args.trainer, plans_b)]
        folders = [_resolve_model(dataset_name, t, p, args.c, args.f, args.checkpoint) for t, p in models]
        out = args.o or os.path.join(nnUNet_results.get(), dataset_name, f"meddisseg_compare_{args.c}_fold_{args.f}")
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
    except (ValueError, FileNotFoundError, OSError) as e:
        print_error("nnUNetv2_meddisseg_compare", e)
        return 1
    with open(result["files"]["table_md"], encoding="utf-8") as f:
        print(f.read())
    print(f"table: {result['files']['table_md']} and {result['files']['table_csv']}")
    print(f"bar chart: {result['files']['chart']}")
    print(f"paired differences: {result['files']['differences_csv']}, statistics: {result['files']['statistics']}")
    if result["files"]["overlays"]:
        print(f"overlays: {os.path.dirname(result['files']['overlays'][0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
