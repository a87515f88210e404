"""One prepared run on a GPU: Med-DisSeg on CUDA, measured against the default nnU-Net.

``python benchmarks/device/run.py OUTDIR [--tiny] [--budget-s N] [--steps ...] [--quality-args "..."]``

Five steps, in this order, each a subprocess with a time limit (the smaller of its cap and the time
left of ``--budget-s``), so that a slow or hanging step cannot eat the rest; the last step selected
(``--steps``) has no cap and takes the time left:

1. ``environment``: GPU, memory, torch / CUDA / cuDNN / triton versions, a C compiler (torch.compile
   needs one), and where every package the run needs is imported from (``probes.py env``).
2. ``throughput``: forward-only inference at 256x256, batch 4 and batch 32, Med-DisSeg vs nnU-Net's
   default 2d network (PlainConvUNet), fp32 / bf16 autocast / channels_last / torch.compile, by
   ``benchmarks/throughput.py`` (three runs: batch 4 eager variants, batch 4 compiled, batch 32),
   beside the paper's 59.6 images/s (batch 4, 256x256, RTX 4090).
3. ``training``: images/s and peak memory of one Med-DisSeg training step at 256x256 with the
   plan's batch size, fp16 autocast + GradScaler, with and without the dispersive loss
   (``probes.py train``).
4. ``cli``: nnU-Net's real commands on CUDA on a subset of the resized Kvasir-SEG (40 train / 8
   validation / 10 test of the shipped split): ``nnUNetv2_meddisseg_convert``,
   ``nnUNetv2_plan_and_preprocess``, ``nnUNetv2_meddisseg_plan``, ``nnUNetv2_train ... -tr
   nnUNetTrainerMedDisSeg_smoke`` with nnU-Net's default torch.compile, ``nnUNetv2_predict``.
5. ``quality``: the time left runs ``benchmarks/quality.py`` (default: ``--device cuda --size 256
   --batch 4`` on the resized Kvasir-SEG with ``nnUNet_compile=f`` and as many iterations as fit;
   ``--quality-args`` replaces these arguments).

A sixth step, ``pace``, runs only when selected (``--steps pace``, at most ``caps["pace"]`` = 480 s in
full mode, whatever the budget): Med-DisSeg at the GPU's pace.

6. ``pace``: (a) ``benchmarks/device/pace.py``: kernel launches and the top 15 kernels (torch.profiler)
   of a Stage II training step at 256x256 (planned batch) and of inference forwards at batch 4 and 32,
   previous vs current block implementations, eager and compiled; training and inference images/s,
   fp32 / bf16 / compiled, against the targets (>= 70 training, >= 300 inference at batch 4);
   (b) nnU-Net's commands on the step 4 subset: ``nnUNetv2_train ... -tr nnUNetTrainerMedDisSeg_smoke``
   with nnU-Net's torch.compile and ``nnUNet_meddisseg_bf16=1`` through ``nnUNetv2_predict``; then
   seconds per epoch of 50 iterations (2 epochs, the second reported) of Med-DisSeg and of the default
   nnU-Net through ``nnUNetv2_train`` (a recipe override file sets their 2-epoch budget), both eager (``nnUNet_compile=f``:
   compiling would not fit the step's time).

Every step appends to ``OUTDIR/results.json`` and ``OUTDIR/results.md`` and repacks
``OUTDIR/logs.tar.gz`` when it ends, so a run cut short still leaves what it measured; step 5 also
copies ``quality.md`` / ``quality.json`` there (five files in all). Work files go to ``--scratch``
(default: a new temporary folder).

The GPU machine needs no installation: console commands are small generated scripts in
``SCRATCH/bin`` (first on ``PATH`` of every step), the repository root is put on ``PYTHONPATH``, and
where ``import SimpleITK`` finds nothing, the stand-in ``benchmarks/device/standins`` too (see
``benchmarks/device/README.md`` for the whole command). ``--tiny`` runs the same steps on the CPU at
64x64 (throughput at 128x128, the smallest size nnU-Net's 7-stage network accepts), a few
iterations, no torch.compile: the check that the script works before it reaches a GPU.
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DEVICE_DIR = Path(__file__).resolve().parent
BENCHMARKS = DEVICE_DIR.parent
REPO_ROOT = BENCHMARKS.parent
STANDINS = DEVICE_DIR / "standins"
DEFAULT_KVASIR = REPO_ROOT / ".device_data" / "Kvasir-SEG"
SHIPPED_SPLIT = REPO_ROOT / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json"
PAPER_IMAGES_PER_S = 59.6  # Med-DisSeg paper: batch 4, 256x256, RTX 4090
STEPS = ("environment", "throughput", "training", "cli", "quality", "pace")
#: the steps run when ``--steps`` is not given (``pace`` is selected explicitly)
DEFAULT_STEPS = STEPS[:5]
CLI_DATASET_ID = 990
#: console commands of nnunetv2 used here, in case its metadata cannot be read
NNUNET_COMMANDS = {"nnUNetv2_plan_and_preprocess":
                   "nnunetv2.experiment_planning.plan_and_preprocess_entrypoints:plan_and_preprocess_entry",
                   "nnUNetv2_train": "nnunetv2.run.run_training:run_training_entry",
                   "nnUNetv2_predict": "nnunetv2.inference.predict_from_raw_data:predict_entry_point"}
LOG_TAIL_BYTES = 400_000  # per log file in logs.tar.gz

#: per mode: step caps in seconds (step 5 takes the rest), sizes, subsets and sub-runs
MODES = {
    "full": {
        "device": "cuda", "budget_s": 450,
        "caps": {"environment": 60, "throughput": 150, "training": 75, "cli": 210, "pace": 480},
        "throughput": [  # (label, arguments of benchmarks/throughput.py, cap in s)
            ("batch4", ["--batch", "4", "--size", "256", "--variants", "fp32", "bf16", "channels_last",
                        "channels_last_bf16", "--repeats", "10"], 50),
            ("batch4_compile", ["--batch", "4", "--size", "256", "--variants", "compile", "--repeats", "10",
                                "--no-profile"], 110),
            ("batch32", ["--batch", "32", "--size", "256", "--variants", "fp32", "bf16", "channels_last_bf16",
                         "--repeats", "5", "--no-profile"], 50)],
        "training": ["--size", "256", "--batch", "0", "--repeats", "10", "--warmup", "3"],
        "cli_size": 256, "cli_cases": (40, 8, 10),
        "cli_timeouts": {"convert": 60, "plan_and_preprocess": 90, "meddisseg_plan": 40, "train": 240,
                         "predict": 90},
        "quality": ["--device", "cuda", "--size", "256", "--batch", "4"],
        # the last command (default nnU-Net's epochs) takes whatever is left of the step's 480 s; the compiled
        # smoke run compiles both stages (Stage I took 115 s on an H200 before the launch-count reduction)
        "pace": {"probe": 130, "probe_args": ["--size", "256", "--batch", "0", "--infer-batches", "4", "32",
                                              "--repeats", "10", "--budget-s", "125"],
                 "epoch_iterations": 50,
                 "timeouts": {"convert": 25, "plan_and_preprocess": 40, "meddisseg_plan": 15, "bf16_train": 150,
                              "bf16_predict": 30, "epochs_meddisseg": 45, "epochs_default": 45}},
    },
    "tiny": {
        "device": "cpu", "budget_s": 5400,  # generous: a shared CPU may be many times slower
        "caps": {"environment": 300, "throughput": 600, "training": 400, "cli": 2100, "pace": 5000},
        "throughput": [
            ("batch1", ["--batch", "1", "--size", "128", "--variants", "fp32", "channels_last_bf16", "--repeats", "1",
                        "--warmup", "0", "--threads", "1"], 300),
            ("batch2", ["--batch", "2", "--size", "128", "--variants", "fp32", "--repeats", "1", "--warmup", "0",
                        "--threads", "1", "--no-profile"], 120)],
        "training": ["--size", "64", "--batch", "2", "--repeats", "2", "--warmup", "1", "--threads", "1"],
        "cli_size": 64, "cli_cases": (6, 2, 2),
        "cli_timeouts": {"convert": 300, "plan_and_preprocess": 600, "meddisseg_plan": 300, "train": 900,
                         "predict": 400},
        "quality": ["--device", "cpu", "--size", "64", "--batch", "2", "--iterations", "8", "--iterations-per-epoch",
                    "2", "--val-iterations", "1", "--threads", "1", "--max-train-cases", "6", "--max-test-cases", "2",
                    "--num-processes", "1", "--methods", "default", "meddisseg"],
        "pace": {"probe": 900, "probe_args": ["--size", "64", "--batch", "2", "--infer-batches", "2", "--repeats", "1",
                                              "--budget-s", "850", "--no-compile", "--threads", "1"],
                 "epoch_iterations": 2,
                 "timeouts": {"convert": 300, "plan_and_preprocess": 600, "meddisseg_plan": 300, "bf16_train": 900,
                              "bf16_predict": 400, "epochs_meddisseg": 600, "epochs_default": 600}},
    },
}


# ------------------------------------------------------------------------------------------------
# environment of the steps


def _our_console_commands() -> Dict[str, str]:
    """``name -> module:function`` of this package's console commands, read from setup.py (the package
    is not installed on the GPU machine)."""
    text = (REPO_ROOT / "setup.py").read_text()
    return dict(re.findall(r'"(nnUNetv2_meddisseg_\w+)=([\w.]+:\w+)"', text))


def _nnunet_console_commands() -> Dict[str, str]:
    try:
        eps = metadata.distribution("nnunetv2").entry_points
        found = {ep.name: ep.value for ep in eps if ep.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        found = {}
    return {**NNUNET_COMMANDS, **found}


def write_command_shims(folder: Path) -> Dict[str, str]:
    """One executable script per console command (``#!`` this Python) in ``folder``; returns them."""
    folder.mkdir(parents=True, exist_ok=True)
    commands = {**_nnunet_console_commands(), **_our_console_commands()}
    for name, target in commands.items():
        module, function = target.split(":")
        script = folder / name
        script.write_text(f"#!{sys.executable}\n# {name}: generated by benchmarks/device/run.py\nimport sys\n\n"
                          f"if __name__ == '__main__':\n    from {module} import {function}\n"
                          f"    sys.exit({function}())\n")
        script.chmod(0o755)
    return commands


def child_environment(bin_dir: Path, tiny: bool) -> Dict[str, str]:
    """``os.environ`` plus: the repository root (and the SimpleITK stand-in where SimpleITK is missing)
    on ``PYTHONPATH``, ``bin_dir`` first on ``PATH``, unbuffered output, no compile in tiny mode."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    resolved = {str(Path(p).resolve()) for p in paths}
    if str(REPO_ROOT) not in resolved:
        paths.insert(0, str(REPO_ROOT))
    if importlib.util.find_spec("SimpleITK") is None and str(STANDINS) not in resolved:
        paths.append(str(STANDINS))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env["nnUNet_extTrainer"] = str(REPO_ROOT / "nnunetv2_meddisseg" / "nnunet_trainers")
    if tiny:
        env["nnUNet_compile"] = "f"
    else:
        env.pop("nnUNet_compile", None)  # nnU-Net's default: compile on CUDA
    return env


# ------------------------------------------------------------------------------------------------
# the run: subprocesses with deadlines, results written after every step


class DeviceRun:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.mode = MODES["tiny" if args.tiny else "full"]
        self.start = time.monotonic()
        default_budget = self.mode["caps"]["pace"] + 10 if list(args.steps) == ["pace"] else self.mode["budget_s"]
        self.deadline = self.start + (args.budget_s or default_budget)
        self.out = Path(args.outdir).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(args.scratch or tempfile.mkdtemp(prefix="meddisseg_device_")).resolve()
        self.logs = self.scratch / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.commands = write_command_shims(self.scratch / "bin")
        self.env = child_environment(self.scratch / "bin", args.tiny)
        self.extra_logs: List[Path] = []
        self.results = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "tiny (CPU)" if args.tiny else "full", "device": self.mode["device"],
            "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
            "budget_s": round(self.deadline - self.start), "host": platform.node(), "scratch": str(self.scratch),
            "pythonpath": self.env["PYTHONPATH"], "steps": {}}

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def is_last_step(self, name: str) -> bool:
        """True when ``name`` is the last of the selected steps (in the fixed order)."""
        return [s for s in STEPS if s in self.args.steps][-1:] == [name]

    def cap(self, name: str) -> float:
        """Seconds step ``name`` may take: its cap, or everything left when no selected step follows it
        (``pace`` keeps its cap)."""
        return math.inf if self.is_last_step(name) and name != "pace" else self.mode["caps"][name]

    def cli_timeout(self, command: str, cap_end: float) -> float:
        """Seconds for one command of step 4: its own limit within the step's cap; when step 4 is the last
        step, training takes what is left after prediction's limit (compilation needs the time)."""
        timeouts = self.mode["cli_timeouts"]
        if command == "train" and self.is_last_step("cli"):
            return self.remaining() - timeouts["predict"]
        return min(timeouts[command], cap_end - time.monotonic())

    def call(self, name: str, command: Sequence[str], cap: float, env: Optional[Dict[str, str]] = None,
             reserve: float = 5.0) -> dict:
        """Run ``command`` (``python`` = this interpreter) with output to ``logs/<name>.log``, killed (its
        whole process group) after ``min(cap, time left - reserve)`` seconds."""
        timeout = min(cap, self.remaining() - reserve)
        log = self.logs / f"{name}.log"
        argv = [sys.executable if command[0] == "python" else command[0], *map(str, command[1:])]
        record = {"name": name, "command": " ".join(shlex.quote(str(c)) for c in command), "log": log.name,
                  "timeout_s": round(timeout, 1)}
        if timeout < 5:
            return {**record, "rc": None, "seconds": 0.0, "timed_out": False, "skipped": "no time left"}
        print(f"  $ {record['command']}  (limit {timeout:.0f} s, log {log})", flush=True)
        start = time.monotonic()
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env or self.env,
                                    cwd=str(REPO_ROOT), start_new_session=True)
            timed_out = _wait_or_kill(proc, timeout)
        record.update(rc=proc.returncode, seconds=round(time.monotonic() - start, 1), timed_out=timed_out)
        if proc.returncode != 0:
            record["log_tail"] = _tail(log, 30)
        print(f"    rc {proc.returncode}{' (time limit)' if timed_out else ''} after {record['seconds']} s", flush=True)
        return record

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.start, 1)
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        (self.out / "results.md").write_text(render_markdown(self.results))
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            for log in sorted(self.logs.glob("*.log")) + self.extra_logs:
                if log.is_file():
                    _add_tail(tar, log, f"logs/{log.name}" if log.parent == self.logs else
                              f"logs/{log.parent.name}/{log.name}")


def _wait_or_kill(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for ``proc``; after ``timeout`` s terminate its process group (then kill it). True if it timed out."""
    try:
        proc.wait(timeout=max(timeout, 0.1))
        return False
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return True


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(log unreadable: {e})"


def _add_tail(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    import io

    data = path.read_bytes()[-LOG_TAIL_BYTES:]
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime = len(data), int(path.stat().st_mtime)
    tar.addfile(info, io.BytesIO(data))


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------
# steps: each returns its result dict with "status" in ok / failed / skipped


def step_environment(run: DeviceRun) -> dict:
    out = run.scratch / "environment.json"
    call = run.call("1_environment", ["python", DEVICE_DIR / "probes.py", "env", out], run.cap("environment"))
    result = {"calls": [call], "probe": _read_json(out)}
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            result["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.SubprocessError) as e:
            result["nvidia_smi"] = f"failed: {e}"
    probe = result["probe"] or {}
    missing = {k: v["error"] for k, v in probe.get("modules", {}).items() if "error" in v}
    broken = {k: v for k, v in probe.get("entry_points", {}).items() if v != "ok"}
    result.update(missing_modules=missing, broken_entry_points=broken)
    result["status"] = "ok" if call["rc"] == 0 and not broken else "failed"
    return result


def step_throughput(run: DeviceRun) -> dict:
    cap_end = time.monotonic() + run.cap("throughput")
    calls, rows, skipped = [], [], {}
    for label, arguments, cap in run.mode["throughput"]:
        out = run.scratch / "throughput" / label
        call = run.call(f"2_throughput_{label}", ["python", BENCHMARKS / "throughput.py", "--device", run.mode["device"],
                                                  "--networks", "MedDisSeg", "PlainConvUNet", *arguments, "--out", out],
                        min(cap, cap_end - time.monotonic()))
        calls.append(call)
        payload = _read_json(out / "throughput.json")
        if payload is None:
            continue
        call["results_md"] = str(out / "throughput.md")
        for key, s in payload["results"].items():
            network, variant = key.split(" / ")
            rows.append({"run": label, "network": network, "variant": variant, "batch": payload["batch"],
                         "size": payload["size"], "median_ms": s["median_s"] * 1e3, "images_per_s": s["images_per_s"],
                         "vs_paper": s["images_per_s"] / PAPER_IMAGES_PER_S})
        skipped.update({f"{label}: {k}": v for k, v in payload.get("skipped", {}).items()})
        if "cdfa_microbenchmark" in payload:
            call["cdfa_speedup"] = payload["cdfa_microbenchmark"].get("speedup_cdfa")
    ok = [c for c in calls if c.get("rc") == 0]
    status = "ok" if len(ok) == len(calls) else ("partial" if ok else "failed")
    return {"status": status, "calls": calls, "rows": rows, "skipped_variants": skipped,
            "paper_images_per_s": PAPER_IMAGES_PER_S}


def step_training(run: DeviceRun) -> dict:
    out = run.scratch / "training.json"
    call = run.call("3_training", ["python", DEVICE_DIR / "probes.py", "train", out, "--device", run.mode["device"],
                                   *run.mode["training"]], run.cap("training"))
    payload = _read_json(out)
    ok = call["rc"] == 0 and payload is not None and all(
        c["all_losses_finite"] and c["last_grads_finite"] for c in payload["configs"])
    return {"status": "ok" if ok else "failed", "calls": [call], "probe": payload}


def write_cli_split(target: Path, counts: Sequence[int]) -> dict:
    """A ``--split-file`` with the first train / val / test cases of the shipped Kvasir-SEG split."""
    shipped = json.loads(SHIPPED_SPLIT.read_text())
    split = {"description": "first cases of the shipped Kvasir-SEG split (benchmarks/device/run.py, step 4)",
             **{key: shipped[key][:n] for key, n in zip(("train", "val", "test"), counts)}}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(split, indent=1) + "\n")
    return split


def _cli_commands(run: DeviceRun, work: Path, kvasir: Path) -> List[tuple]:
    d, dev, size = str(CLI_DATASET_ID), run.mode["device"], str(run.mode["cli_size"])
    processes = str(min(8, os.cpu_count() or 1))
    plans, trainer = "nnUNetMedDisSegPlans", "nnUNetTrainerMedDisSeg_smoke"
    raw = work / "nnUNet_raw"
    return [
        ("convert", ["nnUNetv2_meddisseg_convert", "kvasir-seg", kvasir, "-d", d, "--resize", size, "--split-file",
                     work / "split.json", "--overwrite", "-np", processes]),
        ("plan_and_preprocess", ["nnUNetv2_plan_and_preprocess", "-d", d, "-c", "2d", "-np", processes, "-npfp",
                                 processes]),
        ("meddisseg_plan", ["nnUNetv2_meddisseg_plan", "-d", d]),
        ("train", ["nnUNetv2_train", d, "2d", "0", "-tr", trainer, "-p", plans, "-device", dev]),
        ("predict", ["nnUNetv2_predict", "-i", lambda: _dataset_folder(raw) / "imagesTs", "-o", work / "predictions",
                     "-d", d, "-c", "2d", "-f", "0", "-tr", trainer, "-p", plans, "-device", dev])]


def _dataset_folder(root: Path) -> Path:
    found = sorted(root.glob(f"Dataset{CLI_DATASET_ID:03d}_*"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one Dataset{CLI_DATASET_ID:03d}_* folder in {root}, found {len(found)}")
    return found[0]


def _training_facts(log: Path, results_root: Path) -> dict:
    text = log.read_text(errors="replace") if log.is_file() else ""
    facts = {"compile_used": "Using torch.compile" in text,
             "epoch_times_s": [float(t) for t in re.findall(r"Epoch time: ([0-9.]+) s", text)],
             "stage2_started": "Stage II" in text,
             "pseudo_dice": re.findall(r"Pseudo dice \[([^\]]*)\]", text)}
    facts["nnunet_logs"] = [str(p) for p in sorted(results_root.rglob("training_log_*.txt"))]
    return facts


def step_cli(run: DeviceRun) -> dict:
    kvasir = Path(run.args.kvasir)
    if not (kvasir / "images").is_dir():
        return {"status": "failed", "reason": f"no Kvasir-SEG images in {kvasir}: run benchmarks/device/prepare.py"}
    work = run.scratch / "cli"
    env = dict(run.env)
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        (work / name).mkdir(parents=True, exist_ok=True)
        env[name] = str(work / name)
    split = write_cli_split(work / "split.json", run.mode["cli_cases"])
    cap_end = time.monotonic() + run.cap("cli")
    calls, result = [], {"split": {k: len(v) for k, v in split.items() if isinstance(v, list)},
                         "size": run.mode["cli_size"], "compile_expected": run.mode["device"] == "cuda"}
    for name, command in _cli_commands(run, work, kvasir):
        command = [str(run.scratch / "bin" / command[0]), *[c() if callable(c) else c for c in command[1:]]]
        call = run.call(f"4_cli_{name}", command, run.cli_timeout(name, cap_end), env=env)
        calls.append(call)
        if name == "train":
            result["training"] = _training_facts(run.logs / call["log"], work / "nnUNet_results")
            run.extra_logs += [Path(p) for p in result["training"]["nnunet_logs"]]
        if call.get("rc") != 0:
            break
    result["calls"] = calls
    predicted = sorted((work / "predictions").glob("*.png")) if (work / "predictions").is_dir() else []
    result["predicted_images"] = len(predicted)
    ok = len(calls) == 5 and all(c.get("rc") == 0 for c in calls) and len(predicted) == len(split["test"])
    result["status"] = "ok" if ok else "failed"
    return result


def _quality_supports(option: str) -> bool:
    return f'"{option}"' in (BENCHMARKS / "quality.py").read_text()


def quality_arguments(run: DeviceRun, work: Path, out: Path) -> List[str]:
    """quality.py's arguments: ``--quality-args`` or the mode's defaults (full mode: as many iterations
    as fit the time left); ``--kvasir``, ``--work``, ``--out`` added unless given. Raises ValueError
    when the time left cannot hold the smallest budget."""
    if run.args.quality_args is not None:
        arguments = shlex.split(run.args.quality_args)
    else:
        arguments = list(run.mode["quality"])
        if not run.args.tiny:
            per_epoch = run.args.quality_iterations_per_epoch
            usable = run.remaining() - 15 - run.args.quality_overhead_s
            iterations = int(usable / run.args.quality_s_per_iteration) // per_epoch * per_epoch
            if iterations < 4 * per_epoch:
                raise ValueError(f"{run.remaining():.0f} s left: not enough for 4 epochs of {per_epoch} iterations "
                                 f"({run.args.quality_s_per_iteration} s per iteration for all methods, "
                                 f"{run.args.quality_overhead_s} s for data, start-up and prediction); rerun with "
                                 f"--steps quality and a larger --budget-s")
            arguments += ["--iterations", str(iterations), "--iterations-per-epoch", str(per_epoch),
                          "--val-iterations", "2"]
    for option, value in (("--kvasir", run.args.kvasir), ("--work", work), ("--out", out)):
        if option not in arguments and _quality_supports(option):
            arguments += [option, str(value)]
    return arguments


def step_quality(run: DeviceRun) -> dict:
    work, out = run.scratch / "quality_work", run.scratch / "quality_out"
    try:
        arguments = quality_arguments(run, work, out)
    except ValueError as e:
        return {"status": "skipped", "reason": str(e)}
    env = dict(run.env)
    if not run.args.quality_compile:
        env["nnUNet_compile"] = "f"
    call = run.call("5_quality", ["python", BENCHMARKS / "quality.py", *arguments], run.remaining() - 10, env=env)
    run.extra_logs += sorted((work / "logs").glob("*.log"))
    copied = []
    for name in ("quality.md", "quality.json"):
        if (out / name).is_file():
            shutil.copy2(out / name, run.out / name)
            copied.append(name)
    ok = call.get("rc") == 0 and "quality.json" in copied
    return {"status": "ok" if ok else "failed", "calls": [call], "arguments": arguments,
            "nnUNet_compile": env.get("nnUNet_compile", "(nnU-Net default)"), "copied": copied,
            "summary": _quality_summary(out / "quality.json")}


def _quality_summary(path: Path) -> Optional[dict]:
    payload = _read_json(path)
    if payload is None:
        return None
    return {"budget": payload.get("budget"), "data": payload.get("data"), "seeds": payload.get("seeds"),
            "methods": {k: {"seeds": m.get("seeds"), "val_dice": m.get("val_dice"), "test": m.get("test"),
                            "vs_baseline": m.get("vs_baseline"), "train_wall_s": m.get("train_wall_s"),
                            "s_per_iteration": m.get("s_per_iteration")} for k, m in payload.get("table", {}).items()}}


#: trainers timed per epoch in step 6 (default nnU-Net as the package's seeded nnUNetTrainerBaseline)
PACE_TRAINERS = ("nnUNetTrainerMedDisSeg", "nnUNetTrainerBaseline")
#: the recipe environment variable (``nnunetv2_meddisseg.training.recipe``; the harness does not import the package)
RECIPE_VARIABLE = "nnUNet_meddisseg_recipe"


def write_pace_budget(target: Path, iterations_per_epoch: int) -> Path:
    """The recipe override file of step 6's epoch timing: 2 epochs of ``iterations_per_epoch``, 2 validation
    iterations, no final validation."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"num_epochs": 2, "iterations_per_epoch": iterations_per_epoch,
                                  "val_iterations_per_epoch": 2, "final_validation": False}) + "\n")
    return target


def _epoch_times(log: Path) -> List[float]:
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [float(t) for t in re.findall(r"Epoch time: ([0-9.]+) s", text)]


def step_pace(run: DeviceRun) -> dict:
    settings = run.mode["pace"]
    cap_end = time.monotonic() + min(run.cap("pace"), run.remaining())
    out = run.scratch / "pace.json"
    calls = [run.call("6_pace_probe", ["python", DEVICE_DIR / "pace.py", out, "--device", run.mode["device"],
                                       *settings["probe_args"]], min(settings["probe"], cap_end - time.monotonic()))]
    result = {"calls": calls, "probe": _read_json(out)}
    kvasir = Path(run.args.kvasir)
    if not (kvasir / "images").is_dir():
        return {**result, "status": "failed", "reason": f"no Kvasir-SEG images in {kvasir}: run prepare.py"}
    work = run.scratch / "pace_cli"
    env = dict(run.env)
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        (work / name).mkdir(parents=True, exist_ok=True)
        env[name] = str(work / name)
    split = write_cli_split(work / "split.json", run.mode["cli_cases"])
    budget = write_pace_budget(work / "pace_budget.json", settings["epoch_iterations"])
    bf16_env = {**env, "nnUNet_meddisseg_bf16": "1", "nnUNet_results": str(work / "nnUNet_results_bf16")}
    eager_env = {**env, "nnUNet_compile": "f", RECIPE_VARIABLE: str(budget)}
    (work / "nnUNet_results_bf16").mkdir(exist_ok=True)
    d, dev = str(CLI_DATASET_ID), run.mode["device"]
    prepare = {name: command for name, command in _cli_commands(run, work, kvasir)}
    smoke = "nnUNetTrainerMedDisSeg_smoke"
    commands = [
        ("convert", prepare["convert"], env), ("plan_and_preprocess", prepare["plan_and_preprocess"], env),
        ("meddisseg_plan", prepare["meddisseg_plan"], env),
        ("bf16_train", ["nnUNetv2_train", d, "2d", "0", "-tr", smoke, "-p", "nnUNetMedDisSegPlans", "-device", dev],
         bf16_env),
        ("bf16_predict", ["nnUNetv2_predict", "-i", lambda: _dataset_folder(work / "nnUNet_raw") / "imagesTs", "-o",
                          work / "predictions_bf16", "-d", d, "-c", "2d", "-f", "0", "-tr", smoke, "-p",
                          "nnUNetMedDisSegPlans", "-device", dev], bf16_env),
        ("epochs_meddisseg", ["nnUNetv2_train", d, "2d", "0", "-tr", PACE_TRAINERS[0], "-p",
                              "nnUNetMedDisSegPlans", "-device", dev], eager_env),
        ("epochs_default", ["nnUNetv2_train", d, "2d", "0", "-tr", PACE_TRAINERS[1], "-p", "nnUNetPlans",
                            "-device", dev], eager_env)]
    data_ready = True
    for name, command, command_env in commands:
        if not data_ready:
            break
        if name == "bf16_predict" and calls[-1].get("rc") != 0:
            continue  # nothing trained to predict with
        command = [str(run.scratch / "bin" / command[0]), *[c() if callable(c) else c for c in command[1:]]]
        timeout = settings["timeouts"][name]
        if name == commands[-1][0]:
            timeout = max(timeout, cap_end - time.monotonic())
        call = run.call(f"6_pace_{name}", command, min(timeout, cap_end - time.monotonic()), env=command_env)
        calls.append(call)
        data_ready = name not in ("convert", "plan_and_preprocess", "meddisseg_plan") or call.get("rc") == 0
        if name == "bf16_train":
            result["bf16_training"] = _training_facts(run.logs / call["log"], work / "nnUNet_results_bf16")
            result["bf16_training"]["bf16_used"] = "bf16 autocast, no GradScaler" in (
                (run.logs / call["log"]).read_text(errors="replace") if (run.logs / call["log"]).is_file() else "")
        if name.startswith("epochs_"):
            times = _epoch_times(run.logs / call["log"])
            result[name] = {"epoch_times_s": times, "iterations_per_epoch": settings["epoch_iterations"],
                            "steady_epoch_s": times[-1] if len(times) >= 2 else None}
    predicted = sorted((work / "predictions_bf16").glob("*.png")) if (work / "predictions_bf16").is_dir() else []
    result["bf16_predicted_images"] = len(predicted)
    probe_ok = calls[0].get("rc") == 0 and result["probe"] is not None
    cli_ok = len(calls) == 1 + len(commands) and all(c.get("rc") == 0 for c in calls)
    ok = probe_ok and cli_ok and len(predicted) == len(split["test"])
    result["status"] = "ok" if ok else ("partial" if probe_ok or any(c.get("rc") == 0 for c in calls) else "failed")
    return result


STEP_FUNCTIONS = {"environment": step_environment, "throughput": step_throughput, "training": step_training,
                  "cli": step_cli, "quality": step_quality, "pace": step_pace}


# ------------------------------------------------------------------------------------------------
# report


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> List[str]:
    return (["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
            + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _step_note(step: dict) -> str:
    if step.get("reason"):
        return step["reason"]
    if step.get("error"):
        return step["error"].strip().splitlines()[-1]
    bad = [c for c in step.get("calls", []) if c.get("rc") != 0]
    return "; ".join(f"{c['name']}: " + ("time limit" if c.get("timed_out") else c.get("skipped") or f"rc {c['rc']}")
                     for c in bad)


def _md_environment(step: dict) -> List[str]:
    p = step.get("probe") or {}
    mods = p.get("modules", {})
    lines = [f"- GPU: {p.get('gpu', 'none')} ({p.get('gpu_memory_gib', '?')} GiB, capability "
             f"{p.get('gpu_capability', '?')}); nvidia-smi: {step.get('nvidia_smi', 'n/a')}",
             f"- torch {p.get('torch')} (CUDA {p.get('torch_cuda')}, cuDNN {p.get('cudnn')}), triton "
             f"{mods.get('triton', {}).get('version', 'n/a')}, python {p.get('python')}, {p.get('cpu_count')} CPU cores, "
             f"C compiler: {p.get('c_compiler') or 'none'}",
             f"- nnunetv2 {mods.get('nnunetv2', {}).get('version', '?')} from {mods.get('nnunetv2', {}).get('file', '?')}; "
             f"SimpleITK: {mods.get('SimpleITK', {}).get('version', '?')} ({mods.get('SimpleITK', {}).get('file', '?')})"]
    if step.get("missing_modules"):
        lines.append(f"- not importable: {step['missing_modules']}")
    if step.get("broken_entry_points"):
        lines.append(f"- **entry points failing to import**: {step['broken_entry_points']}")
    return lines


def _md_throughput(step: dict) -> List[str]:
    rows = [[r["run"], r["network"], r["variant"], r["batch"], f"{r['median_ms']:.1f}", f"{r['images_per_s']:.1f}",
             f"{r['vs_paper']:.2f}"] for r in step.get("rows", [])]
    lines = [f"Forward-only inference, eval mode, median of alternating rounds (`benchmarks/throughput.py`); paper: "
             f"{PAPER_IMAGES_PER_S} images/s (Med-DisSeg, batch 4, 256x256, RTX 4090).", ""]
    lines += _table(["run", "network", "variant", "batch", "ms / batch", "images/s", "x paper"], rows)
    lines += [f"- skipped {k}: {v}" for k, v in step.get("skipped_variants", {}).items()]
    return lines


def _md_training(step: dict) -> List[str]:
    p = step.get("probe")
    if not p:
        return ["(no result)"]
    rows = [["yes" if c["dispersive"] else "no", c["batch"], f"{c['size']}x{c['size']}",
             f"{c['median_s_per_step'] * 1e3:.1f}", f"{c['images_per_s']:.1f}", f"{c['peak_memory_gib']:.2f}",
             c["all_losses_finite"] and c["last_grads_finite"], c["grad_scale"]] for c in p["configs"]]
    return ([f"Med-DisSeg Stage II training step ({p['amp']}, Adam, clipping at 12), batch {p['batch']} "
             f"({p['batch_source']}); peak memory: {p['configs'][0]['memory_measure']}.", ""]
            + _table(["dispersive loss", "batch", "size", "ms / step", "images/s", "peak GiB", "finite", "grad scale"],
                     rows))


def _md_cli(step: dict) -> List[str]:
    rows = [[c["name"].replace("4_cli_", ""), c.get("rc"), c.get("seconds"), c.get("skipped", "")
             or ("time limit" if c.get("timed_out") else "")] for c in step.get("calls", [])]
    t = step.get("training", {})
    lines = [f"Kvasir-SEG subset {step.get('split')} at {step.get('size')}x{step.get('size')}; torch.compile "
             f"expected: {step.get('compile_expected')}, used (trainer log): {t.get('compile_used')}; epoch times "
             f"{t.get('epoch_times_s')}; Stage II reached: {t.get('stage2_started')}; predicted test images: "
             f"{step.get('predicted_images')}.", ""]
    return lines + _table(["command", "rc", "seconds", "note"], rows)


def _md_quality(step: dict, out: Path) -> List[str]:
    lines = [f"`quality.py {' '.join(step.get('arguments', []))}` (nnUNet_compile={step.get('nnUNet_compile')})", ""]
    if (out / "quality.md").is_file() and "quality.md" in step.get("copied", []):
        lines += ["See quality.md; its table:", ""] + [
            line for line in (out / "quality.md").read_text().splitlines() if line.startswith("|")]
    return lines


def _md_pace(step: dict) -> List[str]:
    p = step.get("probe") or {}
    lines = [f"Profiles (`benchmarks/device/pace.py`): training step at {p.get('size')}x{p.get('size')}, batch "
             f"{p.get('training_batch')}; inference at batches {p.get('infer_batches')}.", ""]
    lines += _table(["what", "batch", "implementations", "compiled", "launches", "unit", "profiled ms"],
                    [[r["what"], r["batch"], r["implementations"], r["compiled"], r["launches"], r["unit"],
                      f"{r['total_ms']:.1f}"] for r in p.get("profiles", [])])
    targets = p.get("targets", {})
    lines += ["", f"Throughput of the current implementations (targets: training >= "
                  f"{targets.get('training_images_per_s')} images/s, inference at batch 4 >= "
                  f"{targets.get('inference_batch4_images_per_s')}):", ""]
    lines += _table(["what", "batch", "variant", "ms", "images/s"],
                    [[r["what"], r["batch"], r["variant"], f"{r['median_s'] * 1e3:.1f}", f"{r['images_per_s']:.1f}"]
                     for r in p.get("throughput", [])])
    lines += [f"- skipped {k}: {v}" for k, v in p.get("skipped", {}).items()]
    for r in p.get("profiles", []):
        lines += ["", f"Top kernels, {r['what']} batch {r['batch']}, {r['implementations']}, "
                      f"{'compiled' if r['compiled'] else 'eager'}:", ""]
        lines += _table(["kernel", "calls", "self ms"], [[k["name"], k["calls"], f"{k['self_ms']:.2f}"]
                                                         for k in r["top"]])
    t = step.get("bf16_training", {})
    lines += ["", f"nnU-Net's commands with nnUNet_meddisseg_bf16=1: compile used {t.get('compile_used')}, bf16 used "
                  f"{t.get('bf16_used')}, epoch times {t.get('epoch_times_s')}, predicted test images "
                  f"{step.get('bf16_predicted_images')}.", ""]
    lines += _table(["trainer", "iterations / epoch", "epoch times s", "steady epoch s"],
                    [[k[len("epochs_"):], v.get("iterations_per_epoch"), v.get("epoch_times_s"), v.get("steady_epoch_s")]
                     for k, v in step.items() if k.startswith("epochs_")])
    lines += ["", "Commands:", ""] + _table(
        ["command", "rc", "seconds", "note"],
        [[c["name"], c.get("rc"), c.get("seconds"), c.get("skipped", "") or ("time limit" if c.get("timed_out") else "")]
         for c in step.get("calls", [])])
    return lines


def render_markdown(results: dict, out: Optional[Path] = None) -> str:
    steps = results["steps"]
    lines = ["# Device run: Med-DisSeg on CUDA vs the default nnU-Net", "",
             f"- date: {results['date']}; mode: {results['mode']}; budget {results['budget_s']} s, elapsed "
             f"{results.get('elapsed_s')} s", f"- command: `{results['command']}`", "", "## Step timings", ""]
    lines += _table(["step", "status", "seconds", "note"],
                    [[n, s.get("status"), s.get("seconds"), _step_note(s)] for n, s in steps.items()])
    renderers = {"environment": _md_environment, "throughput": _md_throughput, "training": _md_training,
                 "cli": _md_cli, "pace": _md_pace}
    for i, name in enumerate(STEPS, 1):
        if name not in steps:
            continue
        lines += ["", f"## {i}. {name}", ""]
        if name == "quality":
            lines += _md_quality(steps[name], out or Path(results.get("out", ".")))
        else:
            lines += renderers[name](steps[name])
        for call in steps[name].get("calls", []):
            if call.get("log_tail"):
                lines += ["", f"`{call['command']}` failed (rc {call['rc']}), end of {call['log']}:", "", "```",
                          call["log_tail"], "```"]
        if steps[name].get("error"):
            lines += ["", "```", steps[name]["error"], "```"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("outdir", help="folder for results.json, results.md, logs.tar.gz, quality.md, quality.json")
    p.add_argument("--tiny", action="store_true", help="CPU, 64x64, a few iterations, no compile (a test run)")
    p.add_argument("--budget-s", type=float, default=None, help="seconds for all steps (default: 450; tiny 5400)")
    p.add_argument("--steps", nargs="+", choices=STEPS, default=list(DEFAULT_STEPS),
                   help="steps to run (in the fixed order); pace runs only when named")
    p.add_argument("--kvasir", default=str(DEFAULT_KVASIR), help="resized Kvasir-SEG (prepare.py)")
    p.add_argument("--scratch", default=None, help="work folder (default: a new temporary folder)")
    p.add_argument("--quality-args", default=None,
                   help="arguments of benchmarks/quality.py replacing the defaults (--kvasir, --work, --out added "
                        "unless given)")
    p.add_argument("--quality-compile", action="store_true",
                   help="keep nnU-Net's torch.compile in step 5 (default: nnUNet_compile=f, short budgets)")
    p.add_argument("--quality-s-per-iteration", type=float, default=0.3,
                   help="estimated seconds per training iteration of all quality.py methods together (sizes the "
                        "default budget of step 5)")
    p.add_argument("--quality-overhead-s", type=float, default=150,
                   help="estimated seconds of step 5 besides training (conversion, preprocessing, start-up, "
                        "prediction of the test set)")
    p.add_argument("--quality-iterations-per-epoch", type=int, default=25)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    run = DeviceRun(args)
    run.results["out"] = str(run.out)
    print(f"device run ({run.results['mode']}), budget {run.results['budget_s']} s, scratch {run.scratch}, "
          f"results in {run.out}", flush=True)
    for i, name in enumerate(STEPS, 1):
        if name not in args.steps:
            continue
        print(f"[{i}/{len(STEPS)}] {name} ({run.remaining():.0f} s left)", flush=True)
        start = time.monotonic()
        try:
            result = STEP_FUNCTIONS[name](run)
        except Exception:  # noqa: BLE001 - recorded, and the next step still runs
            import traceback
            result = {"status": "failed", "error": traceback.format_exc()}
        result["seconds"] = round(time.monotonic() - start, 1)
        run.results["steps"][name] = result
        run.write()
        print(f"  -> {result['status']} in {result['seconds']} s", flush=True)
    run.write()
    print((run.out / "results.md").read_text())
    failed = [n for n, s in run.results["steps"].items() if s["status"] not in ("ok", "skipped")]
    if failed:
        print(f"steps not ok: {', '.join(failed)} (see {run.out / 'results.md'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
