"""benchmarks/quality.py's study bookkeeping on hand-made runs: the training-log reader, the per-method
aggregation over seeds and the paired comparison to default nnU-Net."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quality  # noqa: E402
import quality_study  # noqa: E402
from quality_budgets import Budget  # noqa: E402

LOG = """2026-11-26 09:10:01.0: Epoch 0
2026-11-26 09:10:02.0: loss terms: dispersive -1.9101, seg 0.0376 
2026-11-26 09:10:02.0: gradient norms (before clipping): decoder 3.366, encoder 44.05
2026-11-26 09:10:02.0: dispersion: effective_rank 6.879, mean_pairwise_distance 1.018
2026-11-26 09:10:03.0: Pseudo dice [np.float32(0.4251)]
2026-11-26 09:10:03.0: Epoch time: 29.52 s
2026-11-26 09:10:04.0: loss terms: dispersive -2.5, seg -0.2994 
2026-11-26 09:10:04.0: gradient norms (before clipping): decoder 4.184, encoder 78.39
2026-11-26 09:10:04.0: dispersion: effective_rank 6.864, mean_pairwise_distance 2.183
2026-11-26 09:10:05.0: Pseudo dice [np.float32(0.6184)]
2026-11-26 09:10:05.0: Epoch time: 10.5 s
"""


def test_training_log_reader(tmp_path):
    log = tmp_path / "training_log.txt"
    log.write_text(LOG)
    read = quality_study.read_training_log(log)
    assert read["epoch_times_s"] == [29.52, 10.5]
    assert read["pseudo_dice"] == [0.4251, 0.6184]
    assert read["curves"] == {"loss_dispersive": [-1.9101, -2.5], "loss_seg": [0.0376, -0.2994],
                              "grad_norm_decoder": [3.366, 4.184], "grad_norm_encoder": [44.05, 78.39],
                              "dispersion_effective_rank": [6.879, 6.864],
                              "dispersion_mean_pairwise_distance": [1.018, 2.183]}


def _run(method, seed, dice, val=None, status="done"):
    cases = {f"case{i}": {"iou": d / (2 - d), "dice": d, "recall": d, "precision": d} for i, d in enumerate(dice)}
    return {"method": method, "seed": seed, "status": status, "val_dice": val, "test_per_case": cases,
            "test_mean": {k: float(np.mean([c[k] for c in cases.values()])) for k in quality_study.METRICS},
            "train_wall_s": 60.0, "epoch_times_s": [10.0, 10.0], "iterations": 20,
            "curves": {"grad_norm_network": [1.0 + seed, 0.5]}}


def test_aggregate_means_spread_and_paired_test():
    rng = np.random.default_rng(0)
    base = [rng.uniform(0.3, 0.9, 12) for _ in range(2)]
    other = [b - rng.uniform(0.0, 0.1, 12) for b in base]
    runs = [_run("default", s, base[s], val=0.6 + 0.1 * s) for s in range(2)]
    runs += [_run("dispersive", 0, other[0], val=0.5), _run("dispersive", 1, other[1], val=0.55),
             _run("dispersive", 2, other[1], status="failed: killed at the deadline")]
    table = quality_study.aggregate(runs, ["default", "dispersive"])
    d = table["dispersive"]
    assert d["seeds"] == [0, 1]
    assert d["val_dice"]["mean"] == pytest.approx(0.525) and d["val_dice"]["sd"] == pytest.approx(np.std([0.5, 0.55],
                                                                                                         ddof=1))
    assert d["test"]["dice"]["mean"] == pytest.approx(np.mean([o.mean() for o in other]))
    assert d["s_per_iteration"]["mean"] == pytest.approx(1.0)
    assert d["diagnostics"]["grad_norm_network"] == {"first_epoch": 1.5, "last_epoch": 0.5}
    differences = (other[0] + other[1]) / 2 - (base[0] + base[1]) / 2  # per image, seed means
    v = d["vs_baseline"]
    assert v["seeds"] == [0, 1] and v["images_worse"] == int((differences < 0).sum())
    assert v["mean_dice_difference"] == pytest.approx(differences.mean())
    assert v["p_value"] == pytest.approx(stats.wilcoxon(differences).pvalue)
    assert "vs_baseline" not in table["default"]
    reversed_table = quality_study.aggregate(runs, ["default", "dispersive"], baseline="dispersive")
    assert "vs_baseline" not in reversed_table["dispersive"]
    assert reversed_table["default"]["vs_baseline"]["mean_dice_difference"] == pytest.approx(-differences.mean())
    label = "iterations20_bs2"
    for r in runs:
        r.update(budget=label, batch=2, images_seen=40)
    markdown = quality_study.markdown({
        "settings": {"dataset": "D", "size": 64, "train_cases": 8, "val_cases": 2, "test_cases": 12, "subset": False,
                     "epochs": 2, "test_time_augmentation": True, "encoder_weights": "random"},
        "baseline": "default", "budgets": {label: {"kind": "iterations", "amount": 20, "batch": 2}},
        "tables": {label: table}, "runs": [r for r in runs if r["status"] == "done"],
        "pending": ["iterations20_bs2 dispersive seed 2 (failed: killed)"],
        "command": "python benchmarks/quality.py --seeds 3",
        "pieces": [{"date": "2026-11-26 09:00 UTC", "device_name": "cpu", "wall_s": 120.0, "compile": "f"},
                   {"date": "2026-11-27 09:00 UTC", "device_name": "cpu", "wall_s": 60.0, "compile": "f",
                    "command": "python benchmarks/quality.py --seeds 3"},
                   {"date": "2026-11-28 09:00 UTC", "device_name": "cpu", "wall_s": 60.0, "compile": "f",
                    "command": "python benchmarks/quality.py --iterations 40"}]})
    assert "### 20 training iterations per run at batch 2" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| nnU-Net + dispersive"))
    assert "| 2 | 2 | 40 |" in row and f"{100 * d['test']['dice']['mean']:.1f} ± " in row
    assert "Not yet done: iterations20_bs2 dispersive seed 2 (failed: killed)." in markdown
    # a piece names its command where it is not the one that started the file
    pieces = next(line for line in markdown.splitlines() if line.startswith("Pieces: "))
    assert pieces.count("`") == 2 and "torch.compile f, `python benchmarks/quality.py --iterations 40`." in pieces
    assert math.isfinite(v["p_value"])


def test_next_seed_runs_one_seed_per_method_and_budget_until_every_arm_has_all():
    images, minutes = Budget("images", 1760), Budget("minutes", 5)
    order = [(b, k, seed) for seed in range(2) for b in (images, minutes) for k in ("default", "meddisseg")]
    everything = quality.selected_runs(order, set(), next_seed=False)
    assert everything == order
    first = quality.selected_runs(order, set(), next_seed=True)
    assert first == [(images, "default", 0), (images, "meddisseg", 0), (minutes, "default", 0),
                     (minutes, "meddisseg", 0)]
    # a command that finished default's seed 0 and was stopped during Med-DisSeg's: the next one runs default's
    # seed 1 and Med-DisSeg's seed 0 again
    done = {("images1760", "default", 0)}
    assert quality.selected_runs(order, done, next_seed=True) == [
        (images, "meddisseg", 0), (minutes, "default", 0), (minutes, "meddisseg", 0), (images, "default", 1)]
    done |= {("images1760", "meddisseg", 0), ("images1760", "default", 1)}
    assert quality.selected_runs(order, done, next_seed=True) == [
        (minutes, "default", 0), (minutes, "meddisseg", 0), (images, "meddisseg", 1)]
    done |= {(b.label, k, seed) for b, k, seed in order}
    assert quality.selected_runs(order, done, next_seed=True) == []
