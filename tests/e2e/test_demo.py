"""The README's main command, ``nnUNetv2_meddisseg_demo``, end to end on its generated dataset with the
``smoke`` schedule (the default ``demo`` schedule runs the same steps with longer training: about 7
minutes on a 2-core CPU, twice the smoke schedule's time)."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

BIN = Path(sys.executable).parent


def test_demo_trains_predicts_evaluates_and_compares(tmp_path):
    out = tmp_path / "demo"  # data of its own: the demo generates, converts and preprocesses it, as for a user
    env = {k: v for k, v in os.environ.items() if not k.startswith("nnUNet_")}  # as on a fresh machine
    env["nnUNet_n_proc_DA"] = "0"  # a user's setting that nnU-Net's planning cannot take: the demo copes
    proc = subprocess.run([str(BIN / "nnUNetv2_meddisseg_demo"), "-o", str(out), "--schedule", "smoke"], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    comparison = out / "comparison"
    assert proc.stdout.startswith("Schedule 'smoke': about ")  # time and disk, before it starts
    assert f"Comparison (table, chart, overlays): {comparison}" in proc.stdout
    assert f"Report with the overlays of the cases that differ most: {comparison / 'comparison.md'}" in proc.stdout
    assert "![" not in proc.stdout  # no markdown image links in a terminal

    table = (comparison / "comparison.md").read_text()
    assert "| nnU-Net |" in table and "| Med-DisSeg |" in table and "Wilcoxon" in table
    with open(comparison / "comparison.csv") as f:
        rows = {row["method"]: row for row in csv.DictReader(f)}
    assert {"nnU-Net", "Med-DisSeg"} <= set(rows)
    assert (comparison / "comparison_bar_chart.png").stat().st_size > 0

    # every one of the 10 generated test images was predicted by both models, as 0/1 label maps
    labels = sorted((out / "nnUNet_raw" / "Dataset501_SyntheticPolyps" / "labelsTs").glob("*.png"))
    assert len(labels) == 10
    for trainer_folder in ("nnUNetTrainerBaseline_smoke__nnUNetPlans__2d",
                           "nnUNetTrainerMedDisSeg_smoke__nnUNetMedDisSegPlans__2d"):
        predictions = sorted((comparison / "predictions" / trainer_folder).glob("*.png"))
        assert [p.name for p in predictions] == [p.name for p in labels]
        assert set(np.unique(np.stack([np.asarray(Image.open(p)) for p in predictions]))) <= {0, 1}

    with open(comparison / "paired_differences.csv") as f:
        differing = sum(float(row["dice_diff"]) != 0 for row in csv.DictReader(f))
    assert len(list((comparison / "overlays").glob("*.png"))) == min(4, differing)
    assert len(list((out / "logs").glob("*.log"))) == 5  # plan, Med-DisSeg plan, two trainings, compare

    # the same command gives the same models: the baseline's training again, in a second results folder
    # (Med-DisSeg's smoke training is run twice, uninterrupted and killed + resumed, and compared tensor by
    # tensor in test_cli_roundtrip.py)
    import torch

    from nnunetv2_meddisseg.environment import trainer_folder

    again = dict(env, nnUNet_raw=str(out / "nnUNet_raw"), nnUNet_preprocessed=str(out / "nnUNet_preprocessed"),
                 nnUNet_results=str(tmp_path / "again"), nnUNet_extTrainer=trainer_folder(), nnUNet_meddisseg_seed="0")
    for trainer, plans in (("nnUNetTrainerBaseline_smoke", "nnUNetPlans"),):
        proc = subprocess.run([str(BIN / "nnUNetv2_train"), "501", "2d", "0", "-tr", trainer, "-p", plans,
                               "-device", "cpu"], env=again, capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        folder = f"Dataset501_SyntheticPolyps/{trainer}__{plans}__2d/fold_0/checkpoint_final.pth"
        first = torch.load(out / "nnUNet_results" / folder, map_location="cpu", weights_only=False)["network_weights"]
        second = torch.load(tmp_path / "again" / folder, map_location="cpu", weights_only=False)["network_weights"]
        assert first.keys() == second.keys()
        for key in first:
            assert torch.equal(first[key], second[key]), f"{trainer}: {key} differs between two runs of the demo"
