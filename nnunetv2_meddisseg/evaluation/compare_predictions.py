"""Two prediction folders against the same references: a markdown + CSV table (the paper's numbers as a reference
row), a bar chart, paired Wilcoxon tests and overlays of the cases that differ most."""
import csv
import json
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from nnunetv2_meddisseg.evaluation.evaluate import (
    METRIC_DISPLAY_NAMES,
    evaluate_folders,
    is_multiclass_summary,
    match_cases,
    read_image,
    read_label_map,
    save_summary,
)
from nnunetv2_meddisseg.evaluation.metrics import BINARY_METRICS
from nnunetv2_meddisseg.evaluation.paired_statistics import compared_metrics, paired_differences, paired_statistics
from nnunetv2_meddisseg.evaluation.paper_reference import organ_key, paper_reference
from nnunetv2_meddisseg.evaluation.plots import bar_chart, most_different_slice, overlay_figure

__all__ = ["OVERLAYS_HEADING", "compare_prediction_folders", "overlay_title", "terminal_text"]

#: the last section of ``comparison.md``: its overlay pictures as markdown image links
OVERLAYS_HEADING = "## Cases that differ most"


def _table_rows(summaries: Sequence[Tuple[str, Mapping]],
                paper: Optional[Tuple[str, dict]]) -> Tuple[List[str], List[Dict]]:
    """(columns, rows) of the comparison table; values in percent (HD95 as is)."""
    first = summaries[0][1]
    organs = list(first["mean"]["per_label"]) if is_multiclass_summary(first) else []
    columns = [f"dice:{o}" for o in organs] + ["dice", "hd95"] if organs else list(BINARY_METRICS)
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
        paper_organs = {organ_key(o): v for o, v in entry.get("per_label_dice", {}).items()}
        for o in organs:
            k = organ_key(o)
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
        w.writerows({k: ("" if r.get(k) is None else r.get(k)) for k in fieldnames} for r in rows)


def _slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z._-]+", "_", name).strip("_") or "model"


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

    image_dir: the input images (``CASE_0000<ending>``) of the overlays, grey without it; paper_key: dataset name
    or key of ``paper_results.json``; labels: ``{name: value}`` as in dataset.json (default binary).
    Returns ``{"summaries", "columns", "table", "differences", "statistics", "paper_key", "files"}``.
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
    metrics = compared_metrics(summaries[0][1])
    differences = paired_differences(summaries[0][1], summaries[1][1], names)
    statistics = paired_statistics(differences, metrics, names)

    files["table_csv"] = os.path.join(out_dir, "comparison.csv")
    _write_table_csv(files["table_csv"], columns, table)
    files["table_md"] = os.path.join(out_dir, "comparison.md")
    md = _markdown_table(title or f"Comparison on {os.path.abspath(ref_dir)}", columns, table, len(differences),
                         paper is not None)
    md += _markdown_statistics(statistics, metrics, names)
    files["differences_csv"] = os.path.join(out_dir, "paired_differences.csv")
    _write_csv(files["differences_csv"], list(differences[0].keys()) if differences else ["case"], differences)
    files["statistics"] = os.path.join(out_dir, "statistics.json")
    with open(files["statistics"], "w", encoding="utf-8") as f:
        json.dump(statistics, f, indent=2)
    files["chart"] = os.path.join(out_dir, "comparison_bar_chart.png")
    _write_chart(files["chart"], columns, table, title or "")

    files["overlays"] = _write_overlays(ref_dir, (pred_a, pred_b), image_dir, ending, differences, names,
                                        os.path.join(out_dir, "overlays"), num_overlays, progress)
    if files["overlays"]:
        md += ["", OVERLAYS_HEADING, ""] + [f"![{os.path.basename(o)}](overlays/{os.path.basename(o)})"
                                             for o in files["overlays"]]
    with open(files["table_md"], "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return {"summaries": dict(summaries), "columns": columns, "table": table, "differences": differences,
            "statistics": statistics, "paper_key": None if paper is None else paper[0], "files": files}


def _write_table_csv(path: str, columns: Sequence[str], table: Sequence[Mapping]) -> None:
    """One row per method: its values and (except per-organ Dice) standard deviations, 4 decimals."""
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
    _write_csv(path, csv_fields, csv_rows)


def _markdown_table(heading: str, columns: Sequence[str], table: Sequence[Mapping], n_cases: int,
                    has_paper: bool) -> List[str]:
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
    if not has_paper:
        md += ["", "The paper reports no results for this dataset (no reference row)."]
    return md


def _markdown_statistics(statistics: Mapping, metrics: Sequence[str], names: Sequence[str]) -> List[str]:
    md = ["", f"## Paired differences ({names[1]} − {names[0]}), Wilcoxon signed-rank test", "",
          "| Metric | mean diff | median diff | better / worse / tied | p-value |", "|---|---|---|---|---|"]
    for m in metrics:
        st = statistics["metrics"][m]
        scale = 1.0 if m == "hd95" else 100.0
        p_txt = _fmt(st["p_value"], 4) if st["p_value"] >= 1e-4 else f"{st['p_value']:.1e}"
        note = f" ({st['note']})" if st["note"] else ""
        md.append(f"| {_column_title(m)} | {scale * st['mean_difference']:+.2f} "
                  f"| {scale * st['median_difference']:+.2f}"
                  f" | {st['n_better']} / {st['n_worse']} / {st['n_tied']} | {p_txt}{note} |")
    return md


def _write_chart(path: str, columns: Sequence[str], table: Sequence[Mapping], title: str) -> None:
    chart_cols = [c for c in columns if c != "hd95"]
    bar_chart([{"name": r["name"], "values": {c: r["values"].get(c) for c in chart_cols},
                "std": {c: r["std"].get(c) for c in chart_cols}} for r in table],
              chart_cols, path, title=title, ylabel="score (%)",
              metric_labels={c: _column_title(c).replace(" (%)", "") for c in chart_cols})


def overlay_title(case: str, names: Sequence[str], dice_diff: float) -> str:
    """Title of a case's overlay; ``dice_diff`` is a fraction, second model minus first."""
    return f"{case}: Dice difference, {names[1]} minus {names[0]}: {100 * dice_diff:+.1f} points"


def terminal_text(report_md: str) -> str:
    """``comparison.md``'s text for a terminal: the tables, without the overlay section's image links."""
    return report_md.split("\n" + OVERLAYS_HEADING + "\n", 1)[0].rstrip("\n") + "\n"


def _write_overlays(ref_dir: str, pred_dirs: Sequence[str], image_dir: Optional[str], ending: str,
                    differences: Sequence[Mapping], names: Sequence[str], overlay_dir: str, num_overlays: int,
                    progress: bool) -> List[str]:
    """Overlays of the ``num_overlays`` cases whose Dice differs most, ties left out; 3D: the most different slice."""
    ranked = sorted((r for r in differences if r["dice_diff"] != 0), key=lambda r: -abs(r["dice_diff"]))
    ranked = ranked[:max(num_overlays, 0)]
    overlays = []
    if ranked:
        os.makedirs(overlay_dir, exist_ok=True)
    for r in tqdm(ranked, desc="overlays", disable=None if progress else True, leave=False):
        case = r["case"]
        ref, _ = read_label_map(os.path.join(ref_dir, case + ending))
        preds = [read_label_map(os.path.join(p, case + ending))[0] for p in pred_dirs]
        image_file = None if image_dir is None else os.path.join(image_dir, f"{case}_0000{ending}")
        image = read_image(image_file) if image_file and os.path.isfile(image_file) else None
        case_title = overlay_title(case, names, r["dice_diff"])
        if ref.ndim == 3:
            z = most_different_slice(ref, preds)
            ref, preds = ref[z], [p[z] for p in preds]
            image = None if image is None else image[z]
            case_title += f" (slice {z})"
        out_file = os.path.join(overlay_dir, f"{_slug(case)}.png")
        overlay_figure(image, ref, preds, names, out_file, title=case_title,
                       scores=[r[f"dice_{names[0]}"], r[f"dice_{names[1]}"]])
        overlays.append(out_file)
    return overlays
