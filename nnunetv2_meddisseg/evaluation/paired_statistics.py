"""Paired per-case comparison of two evaluation summaries: differences and the Wilcoxon signed-rank test."""
from typing import Dict, List, Mapping, Sequence, Tuple

import numpy as np
from scipy import stats

from nnunetv2_meddisseg.evaluation.evaluate import is_multiclass_summary
from nnunetv2_meddisseg.evaluation.metrics import BINARY_METRICS

__all__ = ["compared_metrics", "wilcoxon_p_value", "paired_differences", "paired_statistics"]


def wilcoxon_p_value(differences: Sequence[float]) -> Tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p-value of paired differences, and a note ('' if none); all zero gives
    ``(1.0, note)``, no differences or a scipy failure ``(nan, note)``."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        return float("nan"), "no cases"
    if np.all(d == 0):
        return 1.0, "all paired differences are zero"
    try:
        return float(stats.wilcoxon(d).pvalue), ""
    except ValueError as e:
        return float("nan"), f"wilcoxon failed: {e}"


def compared_metrics(summary: Mapping) -> List[str]:
    """Dice and HD95 for multi-class (Synapse-style) summaries, the four binary metrics otherwise."""
    return ["dice", "hd95"] if is_multiclass_summary(summary) else list(BINARY_METRICS)


def paired_differences(summary_a: Mapping, summary_b: Mapping, names: Sequence[str]) -> List[Dict]:
    """Per-case rows ``{"case", "<metric>_<name a>", "<metric>_<name b>", "<metric>_diff" (b - a)}``, sorted by case."""
    metrics = compared_metrics(summary_a)
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


def paired_statistics(differences: Sequence[Mapping], metrics: Sequence[str], names: Sequence[str]) -> dict:
    """Per metric: Wilcoxon p-value (and note), mean and median difference, and how many cases the
    second model does better / worse / the same (lower is better for HD95)."""
    statistics = {"comparison": f"{names[1]} - {names[0]}", "n_cases": len(differences), "test":
                  "scipy.stats.wilcoxon, two-sided, zero differences dropped", "metrics": {}}
    for m in metrics:
        d = np.array([r[f"{m}_diff"] for r in differences], dtype=np.float64)
        p, note = wilcoxon_p_value(d)
        gain = -d if m == "hd95" else d
        statistics["metrics"][m] = {"p_value": p, "note": note, "mean_difference": float(np.mean(d)),
                                    "median_difference": float(np.median(d)), "n_better": int(np.sum(gain > 0)),
                                    "n_worse": int(np.sum(gain < 0)), "n_tied": int(np.sum(d == 0))}
    return statistics
