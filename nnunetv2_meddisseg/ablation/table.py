"""The ablation table of ``{variant: {seed: record}}``, a record being ``{"summary": <evaluate_folders summary>,
"train_seconds": float, "predict_seconds": float}``. Per variant:

- mean, sd: over seeds of each seed's mean over test cases (sd with ``n - 1``; empty for one seed);
- difference: variant - full method, averaged over the seeds both have;
- p: two-sided Wilcoxon signed-rank test over test cases, pairing each case's metric averaged over those seeds;
- time: mean over seeds of nnU-Net's summed epoch times plus the prediction time.
"""
from __future__ import annotations

import csv
import math
import statistics
from typing import Dict, List, Mapping, Optional, Sequence

from nnunetv2_meddisseg.evaluation.evaluate import METRIC_DISPLAY_NAMES as METRIC_TITLES
from nnunetv2_meddisseg.evaluation.metrics import BINARY_METRICS
from nnunetv2_meddisseg.evaluation.paired_statistics import wilcoxon_p_value

__all__ = ["BINARY_METRICS", "MULTICLASS_METRICS", "METRIC_TITLES", "metrics_of", "ablation_rows",
           "write_csv", "markdown_table"]

MULTICLASS_METRICS = ("dice",)

Records = Mapping[str, Mapping[int, Mapping]]


def metrics_of(summary: Mapping) -> Sequence[str]:
    """The paper's four binary metrics, or the mean Dice over labels for a multi-class summary."""
    return MULTICLASS_METRICS if "labels" in summary else BINARY_METRICS


def _mean_sd(values: Sequence[float]) -> tuple:
    mean = statistics.fmean(values) if values else math.nan
    return mean, (statistics.stdev(values) if len(values) > 1 else math.nan)


def _per_case_over_seeds(records: Mapping[int, Mapping], seeds: Sequence[int], metric: str) -> Dict[str, float]:
    """``{case: metric averaged over seeds}``."""
    cases: Dict[str, List[float]] = {}
    for seed in seeds:
        for row in records[seed]["summary"]["metric_per_case"]:
            cases.setdefault(row["case"], []).append(row[metric])
    return {case: statistics.fmean(values) for case, values in cases.items()}


def _comparison(records: Mapping[int, Mapping], reference: Mapping[int, Mapping], metric: str) -> tuple:
    """(difference of means over the common seeds, Wilcoxon p over cases, note)."""
    seeds = sorted(set(records) & set(reference))
    if not seeds:
        return math.nan, math.nan, "no seed in common with the full method"
    diff = statistics.fmean(records[s]["summary"]["mean"][metric] - reference[s]["summary"]["mean"][metric]
                            for s in seeds)
    a = _per_case_over_seeds(records, seeds, metric)
    b = _per_case_over_seeds(reference, seeds, metric)
    if set(a) != set(b):
        return diff, math.nan, "the runs cover different test cases"
    p, note = wilcoxon_p_value([a[c] - b[c] for c in sorted(a)])
    return diff, p, note


def ablation_rows(records: Records, reference: str, order: Optional[Sequence[str]] = None) -> List[dict]:
    """One row per variant in ``order`` (default: ``records``), metrics as fractions; the full method's diff, p: NaN."""
    order = list(order or records)
    first = next(iter(records[order[0]].values()))
    metrics = metrics_of(first["summary"])
    rows = []
    for variant in order:
        runs = records[variant]
        seeds = sorted(runs)
        row: dict = {"variant": variant, "seeds": len(seeds)}
        notes = set()
        for m in metrics:
            row[f"{m}_mean"], row[f"{m}_sd"] = _mean_sd([runs[s]["summary"]["mean"][m] for s in seeds])
            if variant == reference or reference not in records:
                row[f"{m}_diff"], row[f"{m}_p"] = math.nan, math.nan
            else:
                row[f"{m}_diff"], row[f"{m}_p"], note = _comparison(runs, records[reference], m)
                notes.add(note)
        row["seconds_per_run"] = statistics.fmean(runs[s]["train_seconds"] + runs[s]["predict_seconds"]
                                                  for s in seeds)
        row["note"] = "; ".join(sorted(n for n in notes if n))
        rows.append(row)
    return rows


def write_csv(rows: Sequence[Mapping], path: str) -> None:
    """The rows as CSV (metrics as fractions, empty cells for NaN)."""
    fields = list(rows[0].keys())
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})


def _percent(mean: float, sd: float) -> str:
    if math.isnan(mean):
        return "-"
    return f"{100 * mean:.1f}" + ("" if math.isnan(sd) else f" ± {100 * sd:.1f}")


def _difference(diff: float, p: float) -> str:
    if math.isnan(diff):
        return "-"
    return f"{100 * diff:+.1f}" + ("" if math.isnan(p) else f" (p={p:.3g})")


def markdown_table(rows: Sequence[Mapping], reference: str) -> str:
    """Metrics in percent (mean ± sd over seeds), each one's difference to ``reference`` (p), minutes per run."""
    metrics = [k[:-5] for k in rows[0] if k.endswith("_mean")]
    titles = [METRIC_TITLES.get(m, m) for m in metrics]
    header = (["Variant", "Seeds"] + titles + [f"Δ {t} (p)" for t in titles] + ["Minutes per run"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        name = f"**{row['variant']}** (full method)" if row["variant"] == reference else row["variant"]
        cells = [name, str(row["seeds"])]
        cells += [_percent(row[f"{m}_mean"], row[f"{m}_sd"]) for m in metrics]
        cells += [_difference(row[f"{m}_diff"], row[f"{m}_p"]) for m in metrics]
        cells.append(f"{row['seconds_per_run'] / 60:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
