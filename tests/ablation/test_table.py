"""The ablation table on hand-made summaries: mean / sd over seeds, difference and paired Wilcoxon test."""
import math

import pytest
from scipy import stats

from nnunetv2_meddisseg.ablation.table import ablation_rows, markdown_table, write_csv

METRICS = ("iou", "dice", "recall", "precision")


def record(per_case_dice, seconds=(60.0, 6.0)):
    cases = [{"case": f"c{i}", **{m: v for m in METRICS}} for i, v in enumerate(per_case_dice)]
    mean = {m: sum(per_case_dice) / len(per_case_dice) for m in METRICS}
    return {"summary": {"metric_per_case": cases, "mean": mean, "std": {}},
            "train_seconds": seconds[0], "predict_seconds": seconds[1]}


def test_rows_by_hand():
    full = {0: record([0.8, 0.6, 0.7, 0.9, 0.5, 0.4]), 1: record([0.6, 0.6, 0.9, 0.7, 0.5, 0.6], (120.0, 6.0))}
    variant = {0: record([0.7, 0.6, 0.6, 0.8, 0.3, 0.4]), 1: record([0.5, 0.4, 0.8, 0.6, 0.4, 0.1])}
    rows = ablation_rows({"full": full, "v": variant}, "full")
    assert [r["variant"] for r in rows] == ["full", "v"]
    f, v = rows
    # per-seed means 0.65 and 0.65 -> mean 0.65, sd 0; variant 0.5667 and 0.4667
    assert f["dice_mean"] == pytest.approx(0.65) and f["dice_sd"] == pytest.approx(0.0, abs=1e-12)
    assert v["dice_mean"] == pytest.approx((3.4 / 6 + 2.8 / 6) / 2)
    assert v["dice_sd"] == pytest.approx(math.sqrt(2 * (0.6 / 6 / 2) ** 2))  # two values 0.1 apart
    assert v["dice_diff"] == pytest.approx(v["dice_mean"] - 0.65)
    # per case averaged over the two seeds, then the two-sided signed-rank test
    a = [(x + y) / 2 for x, y in zip([0.7, 0.6, 0.6, 0.8, 0.3, 0.4], [0.5, 0.4, 0.8, 0.6, 0.4, 0.1])]
    b = [(x + y) / 2 for x, y in zip([0.8, 0.6, 0.7, 0.9, 0.5, 0.4], [0.6, 0.6, 0.9, 0.7, 0.5, 0.6])]
    assert v["dice_p"] == pytest.approx(stats.wilcoxon([x - y for x, y in zip(a, b)]).pvalue)
    assert math.isnan(f["dice_diff"]) and math.isnan(f["dice_p"])
    assert f["seconds_per_run"] == pytest.approx((66 + 126) / 2) and f["seeds"] == 2


def test_single_seed_has_no_sd_and_files(tmp_path):
    rows = ablation_rows({"full": {0: record([0.5, 0.7])}, "v": {0: record([0.5, 0.7])}}, "full")
    assert math.isnan(rows[0]["dice_sd"])
    assert rows[1]["dice_diff"] == 0.0 and rows[1]["dice_p"] == 1.0 and "zero" in rows[1]["note"]
    write_csv(rows, str(tmp_path / "t.csv"))
    header, first, _ = (tmp_path / "t.csv").read_text().splitlines()
    assert header.startswith("variant,seeds,iou_mean,iou_sd,iou_diff,iou_p")
    assert first.startswith("full,1,0.6,,,")
    md = markdown_table(rows, "full")
    assert "| **full** (full method) | 1 | 60.0 | 60.0 | 60.0 | 60.0 | - | - | - | - | 1.1 |" in md
    assert "| v | 1 | 60.0 | 60.0 | 60.0 | 60.0 | +0.0 (p=1) |" in md
