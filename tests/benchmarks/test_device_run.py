"""The device run end to end in its CPU tiny mode: prepare's data step on a generated Kvasir-SEG-like
folder (case names from the shipped split), then ``benchmarks/device/run.py --tiny`` through all five
steps (environment, throughput, training step, nnU-Net's commands, quality.py). About ten minutes on a
CPU: marked ``slow`` (run it with ``-m slow`` before a GPU run); its parts are tested in
test_device_standins.py."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEVICE_DIR = REPO_ROOT / "benchmarks" / "device"
SPLIT = REPO_ROOT / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json"


def _fake_kvasir(folder: Path, names) -> None:
    """Kvasir-SEG layout: images/ID.jpg (RGB, odd sizes) and masks/ID.jpg (an ellipse, RGB JPEG)."""
    rng = np.random.default_rng(0)
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    for i, name in enumerate(names):
        h, w = 70 + 3 * i, 90 - 2 * i
        yy, xx = np.mgrid[:h, :w]
        inside = ((yy - h / 2) / (h / 4)) ** 2 + ((xx - w / 2 - i) / (w / 5)) ** 2 < 1
        image = rng.integers(0, 120, (h, w, 3), dtype=np.uint8)
        image[inside] += 100
        Image.fromarray(image).save(folder / "images" / f"{name}.jpg", quality=95)
        Image.fromarray(np.stack([inside.astype(np.uint8) * 255] * 3, -1)).save(folder / "masks" / f"{name}.jpg")


def test_device_run_tiny_end_to_end(tmp_path):
    spec = importlib.util.spec_from_file_location("device_prepare", DEVICE_DIR / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    shipped = json.loads(SPLIT.read_text())
    # what run.py --tiny uses: the first 6 / 2 / 2 cases (step 4's split and quality.py's debugging subset)
    names = shipped["train"][:6] + shipped["val"][:2] + shipped["test"][:2]
    _fake_kvasir(tmp_path / "source" / "Kvasir-SEG", names)
    kvasir = tmp_path / "device_data" / "Kvasir-SEG"
    assert prepare.write_resized_kvasir(tmp_path / "source" / "Kvasir-SEG", kvasir, 64) == len(names)

    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(DEVICE_DIR / "run.py"), str(out), "--tiny", "--kvasir", str(kvasir),
                           "--scratch", str(tmp_path / "scratch")], env=env, capture_output=True, text=True,
                          timeout=6000)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    steps = results["steps"]
    assert list(steps) == ["environment", "throughput", "training", "cli", "quality"]
    assert {n: s["status"] for n, s in steps.items()} == dict.fromkeys(steps, "ok")
    assert steps["environment"]["probe"]["entry_points"] == dict.fromkeys(steps["environment"]["probe"]
                                                                          ["entry_points"], "ok")
    networks = {(r["network"], r["variant"], r["batch"]) for r in steps["throughput"]["rows"]}
    assert {("MedDisSeg", "fp32", 1), ("PlainConvUNet", "fp32", 1), ("MedDisSeg", "fp32", 2)} <= networks
    assert all(r["images_per_s"] > 0 for r in steps["throughput"]["rows"])
    configs = steps["training"]["probe"]["configs"]
    assert [c["dispersive"] for c in configs] == [False, True]
    assert all(c["all_losses_finite"] and c["last_grads_finite"] and c["images_per_s"] > 0 for c in configs)
    cli = steps["cli"]
    assert [c["name"] for c in cli["calls"]] == [f"4_cli_{n}" for n in ("convert", "plan_and_preprocess",
                                                                      "meddisseg_plan", "train", "predict")]
    assert cli["predicted_images"] == 2 and cli["training"]["compile_used"] is False
    assert len(cli["training"]["epoch_times_s"]) == 3 and cli["training"]["stage2_started"]
    quality = json.loads((out / "quality.json").read_text())
    assert quality["data"]["test_cases"] == 2 and set(quality["table"]) == {"default", "meddisseg"}
    for m in quality["table"].values():
        assert m["seeds"] == [0]
        assert all(0 <= m["test"][k]["mean"] <= 1 for k in ("iou", "dice", "recall", "precision"))
        assert 0 <= m["val_dice"]["mean"] <= 1
    assert "vs_baseline" in quality["table"]["meddisseg"]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "quality.json", "quality.md", "results.json",
                                                     "results.md"]
    md = (out / "results.md").read_text()
    assert "## Step timings" in md and "## 5. quality" in md and "59.6" in md
