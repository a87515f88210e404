"""``benchmarks/gpu.py`` on the CPU: the log lines it reads from nnU-Net's training logs (built in the trainer's
format), the time caps and the budget, the targets, the refusal without a GPU, and the whole command's CPU path
(every step at 32x32 on a generated Kvasir-SEG-layout folder) with its results files and logs."""
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from nnunet_cli import fake_kvasir

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu  # noqa: E402
from common import write_kvasir_split  # noqa: E402
from gpu_commands import (  # noqa: E402
    compile_figures,
    epoch_times,
    peak_memory_gib,
    schedule_hours,
)

STAMP = "2026-11-28 16:29:43.527411: "


def test_refuses_without_cuda_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu.main(["--session", "unused"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "no CUDA GPU here" in err[-1] and "--device cpu" in err[-1]


def test_compile_lines_of_the_training_log():
    log = "\n".join([
        f"{STAMP}torch.compile: on (1000 epochs repay about 120 s of compilation) ",
        f'{STAMP}torch.compile: graph "Stage I training" compiled in 41.2 s ',
        f"{STAMP}Epoch time: 50.5 s ",
        f'{STAMP}torch.compile: graph "Stage II training" compiled in 63.0 s ',
        f"{STAMP}peak GPU memory 5.25 GiB (batch 10) ",
        f"{STAMP}Epoch time: 12.25 s ",
        f"{STAMP}peak GPU memory 6.5 GiB (batch 10) "])
    figures = compile_figures(log)
    assert figures == {"decision": "on", "reason": "1000 epochs repay about 120 s of compilation", "compiled": True,
                       "compile_s": {"Stage I training": 41.2, "Stage II training": 63.0}, "compile_s_total": 104.2}
    assert epoch_times(log) == [50.5, 12.25]
    assert peak_memory_gib(log) == 6.5
    eager = compile_figures(f"{STAMP}torch.compile: off (3 epochs cannot repay the compilation) \n"
                                f"{STAMP}Epoch time: 3.0 s ")
    assert eager["decision"] == "off" and eager["compiled"] is False and eager["compile_s"] is None
    assert compile_figures(f"{STAMP}Epoch time: 3.0 s ") == {
        "decision": None, "reason": None, "compiled": False, "compile_s": None, "compile_s_total": None}
    assert peak_memory_gib("") is None
    # logs without the decision line: the trainers' own lines of a compiled network, or of none
    assert compile_figures(f"{STAMP}torch.compile (inductor) of the whole network, static shapes ")["compiled"]
    assert compile_figures(f"{STAMP}Using torch.compile... ")["compiled"]
    assert not compile_figures(f"{STAMP}INFO: torch.compile disabled because device is CPU ")["compiled"]
    assert not compile_figures(f"{STAMP}Using torch.compile... \n{STAMP}WARNING: torch.compile failed (x); "
                                   f"training continues without compilation ")["compiled"]


def _session(tmp_path, steps, budget_s=520.0, cap_scale=1.0):
    args = SimpleNamespace(session=tmp_path / "out", work=tmp_path / "work", budget_s=budget_s, steps=steps,
                           cap_scale=cap_scale)
    return gpu.Session(args, "NVIDIA H200")


def test_caps_leave_the_floors_of_later_steps(tmp_path, monkeypatch):
    session = _session(tmp_path, ["environment", "eager", "main", "epochs"])
    assert session.files["gpu"].name == "gpu_nvidia_h200" and session.files["gpu_cli"].name == "gpu_cli_nvidia_h200"
    assert session.cap("environment", "environment") == gpu.CAPS["environment"]
    clock = time.monotonic()
    monkeypatch.setattr(gpu.time, "monotonic", lambda: clock + 300)  # 300 s spent: 220 left
    assert session.cap("train_forced", "main") == pytest.approx(220 - gpu.FLOORS["epochs"], abs=1)
    assert session.cap("baseline_eager", "epochs") == gpu.CAPS["baseline_eager"]
    monkeypatch.setattr(gpu.time, "monotonic", lambda: clock + 518)
    record = session.call("late", ["python", "-c", "print(1)"], {}, "predict", "epochs")
    assert record["rc"] == "not started (time budget)"
    scaled = _session(tmp_path, ["epochs"], cap_scale=2)
    assert scaled.cap("predict", "epochs") == 2 * gpu.CAPS["predict"]


def test_a_command_over_its_cap_is_stopped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu.CAPS, "predict", 6)
    session = _session(tmp_path, ["main"])
    start = time.monotonic()
    record = session.call("slow", ["python", "-c", "import time; time.sleep(30)"], {}, "predict", "main")
    assert record["rc"] == "stopped at its cap" and time.monotonic() - start < 20
    assert (session.logs / "slow.log").is_file()


def test_targets_and_schedule_hours(tmp_path):
    session = _session(tmp_path, list(gpu.STEPS))
    session.gpu.update(settings={"infer_batch": 32}, meddisseg={
        "train_fp32": 50.0, "train_bf16": 65.0, "infer_b4_fp32": 260.0, "infer_b32_bf16_channels_last": 390.0,
        "peak_train_memory_gib_fp32": 7.0, "peak_train_memory_gib_bf16": 5.0})
    warm = {"seconds": 5.0, "images_per_s": 100.0}
    session.cli.update(completed_through_predict=True, compile_s_total=150.0,
                       main={"forced": {"stage2_warm_epoch": warm, "peak_memory_gib": 9.0}})
    targets = session.targets()
    assert targets["train_eager"]["measured"] == 65.0 and targets["train_eager"]["met"] is True
    assert targets["train_compiled"]["measured"] == 100.0 and targets["train_compiled"]["met"] is False
    assert targets["infer_b32_eager"]["met"] is False and targets["infer_b4_fp32"]["met"] is True
    assert targets["infer_b32_compiled"] == {"target": ">= 600", "measured": None, "met": None,
                                             "source": "step compiled"}
    assert targets["bf16_over_fp32_training"]["measured"] == 1.3 and targets["bf16_over_fp32_training"]["met"]
    assert targets["completed_through_predict"]["met"] is True and targets["compile_s_total"]["met"] is True
    assert targets["peak_memory_gib"]["measured"] == 9.0 and targets["peak_memory_gib"]["met"] is False
    epochs = {"meddisseg_eager": {"stage1_epoch": {"seconds": 20.0}, "stage2_warm_epoch": {"seconds": 10.0}},
              "nnunet_compiled": {"warm_epoch": {"seconds": 2.0}}, "skipped": "reason"}
    hours = schedule_hours(epochs, iterations=50)
    # (250 x 20 + 750 x 10) s x 250 / 50 iterations; 1000 x 2 s x 5
    assert hours == {"meddisseg_eager": round(62500 / 3600, 1), "nnunet_compiled": round(10000 / 3600, 1)}


def test_split_comes_from_the_shipped_split(tmp_path):
    split = write_kvasir_split(tmp_path / "split.json", (3, 2, 1), "a test")
    shipped = json.loads((BENCHMARKS.parent / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json")
                         .read_text())
    assert split["train"] == shipped["train"][:3] and split["val"] == shipped["val"][:2]
    assert json.loads((tmp_path / "split.json").read_text())["test"] == shipped["test"][:1]


@pytest.mark.e2e
def test_the_whole_command_on_the_cpu(tmp_path):
    """Every step at 32x32 (4 / 1 / 1 cases, epochs of 2 iterations), the main command as the trainer decides and
    nnU-Net's trainer eager: both results files with every step's figures, and the logs."""
    kvasir = fake_kvasir(tmp_path / "Kvasir-SEG", (4, 1, 1))
    out = tmp_path / "out"
    command = [sys.executable, str(BENCHMARKS / "gpu.py"), "--session", str(out), "--device", "cpu", "--kvasir",
               str(kvasir), "--size", "32", "--cases", "4", "1", "1", "--iterations", "2", "--val-iterations", "1",
               "--repeats", "1", "--infer-batch", "2", "--batch", "2", "--main-arms",
               "decided", "--epoch-arms", "eager", "--cap-scale", "4", "--budget-s", "900", "--work",
               str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(next(out.glob("gpu_cpu_*.json")).read_text())
    assert {s: r["rc"] for s, r in figures["steps"].items()} == {"environment": 0, "eager": 0}
    checks = figures["kernel_checks"]
    assert all(r["passed"] for r in checks["instance_norm_channels_last"].values())
    assert all(r.get("passed") or "skipped" in r for named in checks.values() for r in named.values())
    for network in ("meddisseg", "nnunet"):
        assert all(figures[network][k] > 0 for k in ("train_fp32", "train_bf16", "infer_b4_fp32",
                                                     "infer_b2_bf16_channels_last"))
    assert "not measured" in figures["fused_vs_shifted"]  # no fused form on the CPU, so no ratio
    assert figures["targets"]["train_eager"]["measured"] > 0
    cli = json.loads(next(out.glob("gpu_cli_cpu_*.json")).read_text())
    assert all(c["rc"] == 0 for c in cli["commands"]), cli["commands"]
    assert [c["label"] for c in cli["commands"]] == [
        "convert", "plan_and_preprocess", "meddisseg_plan", "main_decided_train", "main_decided_predict",
        "main_decided_evaluate", "epochs_baseline_eager_train"]
    decided = cli["main"]["decided"]
    assert len(decided["epoch_s"]) == 3 and decided["completed_through_predict"] is True
    assert decided["predicted_cases"] == "1 of 1" and 0 <= decided["test_mean"]["dice"] <= 1
    assert cli["completed_through_predict"] is False  # no compiled run
    assert decided["compiled"] is False and cli["epochs"]["meddisseg_eager"]["from"] == "main decided"
    assert len(cli["epochs"]["nnunet_eager"]["epoch_s"]) == 2 and cli["epochs"]["nnunet_eager"]["compiled"] is False
    assert cli["default_schedule_hours"]["nnunet_eager"] > 0
    assert "| main command |" in next(out.glob("gpu_cli_cpu_*.md")).read_text()
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert "logs/main_decided_train.log" in names and "logs/eager.log" in names
