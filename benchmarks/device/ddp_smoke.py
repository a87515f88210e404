"""A prepared smoke run of nnU-Net's multi-GPU training (``-num_gpus N``) with our trainers.

``python benchmarks/device/ddp_smoke.py OUTDIR [--num-gpus 2] [--timeout-s 540] [--compile] [--dry-run]``

On a machine with at least N CUDA GPUs, in a scratch folder: a generated 64x64 dataset
(``datasets.synthetic``, 40 training cases per GPU, so that nnU-Net's plans, which cover at most 5%
of the dataset per batch, give a batch of 2N), ``nnUNetv2_plan_and_preprocess -c 2d``,
``nnUNetv2_meddisseg_plan --batch-size 2N`` (two samples per GPU), then

- ``nnUNetv2_train D 2d 0 -tr nnUNetTrainerMedDisSeg_smoke -p nnUNetMedDisSegPlans -num_gpus N``
  (Stage I, the switch, two Stage II epochs, validation), and
- ``nnUNetv2_train D 2d 0 -tr nnUNetTrainerDispersive_smoke -num_gpus N`` (nnU-Net's own plans and
  network, batch 2N).

Each run passes when it exits with 0, writes ``checkpoint_final.pth``, logs finite loss terms in every
epoch (rank 0's log, with the terms averaged over the ranks) and no start-up warning that the
dispersive loss sees too few samples; the MedDisSeg run must also have reached Stage II.
``OUTDIR/ddp_smoke.json`` and ``ddp_smoke.md`` hold the commands, return codes, times, the parsed
loss terms and the tails of failed logs. With fewer than N GPUs nothing runs: the results say so and
the exit code is 2. ``--dry-run`` writes the commands only. torch.compile is off
(``nnUNet_compile=f``) unless ``--compile``. Console commands and ``PYTHONPATH`` as in ``run.py``
(the package need not be installed; see ``README.md`` in this folder).
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DEVICE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(DEVICE_DIR))
from run import REPO_ROOT, _tail, _wait_or_kill, child_environment, write_command_shims  # noqa: E402

DATASET_ID = 992
PLANS = "nnUNetMedDisSegPlans"
TRAINERS = (("meddisseg", "nnUNetTrainerMedDisSeg_smoke", PLANS), ("dispersive", "nnUNetTrainerDispersive_smoke",
                                                                   "nnUNetPlans"))
STARTUP_WARNING = "WARNING: the dispersive loss"


def commands(bin_dir: Path, num_gpus: int) -> List[tuple]:
    """``(name, argv)`` of the nnU-Net commands, in order (the dataset is generated before them)."""
    d = str(DATASET_ID)
    processes = str(min(8, os.cpu_count() or 1))
    steps = [("plan_and_preprocess", ["nnUNetv2_plan_and_preprocess", "-d", d, "-c", "2d", "-np", processes,
                                      "-npfp", processes]),
             ("meddisseg_plan", ["nnUNetv2_meddisseg_plan", "-d", d, "--batch-size", str(2 * num_gpus)])]
    for name, trainer, plans in TRAINERS:
        steps.append((f"train_{name}", ["nnUNetv2_train", d, "2d", "0", "-tr", trainer, "-p", plans,
                                        "-num_gpus", str(num_gpus)]))
    return [(name, [str(bin_dir / argv[0]), *argv[1:]]) for name, argv in steps]


def loss_terms(log_text: str) -> List[Dict[str, float]]:
    """Per epoch, the ``loss terms: name value, ...`` line of a trainer's log as a dict."""
    epochs = []
    for line in re.findall(r"loss terms: (.*)", log_text):
        terms = {}
        for item in line.strip().split(", "):
            name, _, value = item.strip().rpartition(" ")
            terms[name] = float(value)
        epochs.append(terms)
    return epochs


def check_training(log_text: str, final_checkpoint: bool, meddisseg: bool, epochs: int) -> List[str]:
    """What is wrong with a finished training run (empty: nothing)."""
    problems = []
    if not final_checkpoint:
        problems.append("no checkpoint_final.pth")
    terms = loss_terms(log_text)
    if len(terms) != epochs:
        problems.append(f"loss terms logged for {len(terms)} epochs, expected {epochs}")
    if any(not math.isfinite(v) for epoch in terms for v in epoch.values()):
        problems.append("a loss term is not finite")
    if STARTUP_WARNING in log_text:
        problems.append("the dispersive loss sees too few samples (start-up warning)")
    if meddisseg and "Stage II" not in log_text:
        problems.append("Stage II never started")
    return problems


def _cuda_devices() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


def _write(out: Path, results: dict) -> None:
    (out / "ddp_smoke.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    lines = [f"# -num_gpus {results['num_gpus']} smoke run", "", f"status: **{results['status']}**"
             + (f" ({results['reason']})" if results.get("reason") else ""), "",
             "| step | rc | seconds | problems |", "|---|---|---|---|"]
    for step in results["steps"]:
        lines.append(f"| {step['name']} | {step.get('rc')} | {step.get('seconds')} | "
                     f"{'; '.join(step.get('problems', [])) or '-'} |")
    lines += ["", "Commands:", ""] + [f"    {c}" for c in results["commands"]]
    (out / "ddp_smoke.md").write_text("\n".join(lines) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--num-gpus", type=int, default=2, help="processes (GPUs) of nnU-Net's DDP training")
    p.add_argument("--timeout-s", type=float, default=540, help="seconds for all steps together")
    p.add_argument("--scratch", default=None, help="work folder (default: a new temporary folder)")
    p.add_argument("--compile", action="store_true", help="keep nnU-Net's torch.compile (default: off)")
    p.add_argument("--dry-run", action="store_true", help="write the commands, run nothing")
    args = p.parse_args(argv)
    if args.num_gpus < 2:
        p.error(f"--num-gpus must be at least 2 (nnU-Net's DDP), got {args.num_gpus}")
    deadline = time.monotonic() + args.timeout_s
    out = Path(args.outdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="meddisseg_ddp_")).resolve()
    write_command_shims(scratch / "bin")
    env = child_environment(scratch / "bin", tiny=not args.compile)
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
        env[name] = str(scratch / name)
    steps = commands(scratch / "bin", args.num_gpus)
    results = {"num_gpus": args.num_gpus, "status": "ok", "steps": [],
               "commands": [" ".join(shlex.quote(a) for a in argv) for _, argv in steps]}
    found = _cuda_devices()
    if args.dry_run or found < args.num_gpus:
        results["status"] = "not run"
        results["reason"] = "--dry-run" if args.dry_run else f"needs {args.num_gpus} CUDA GPUs, found {found}"
        _write(out, results)
        print(results["reason"] + "\n" + "\n".join(results["commands"]))
        return 0 if args.dry_run else 2

    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset
    make_synthetic_dataset(scratch / "nnUNet_raw", dataset_id=DATASET_ID, num_train=40 * args.num_gpus, num_test=4,
                           size=64, seed=0, overwrite=True)
    trainers = {f"train_{name}": (trainer, plans) for name, trainer, plans in TRAINERS}
    for name, argv in steps:
        log = scratch / f"{name}.log"
        start = time.monotonic()
        with open(log, "w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT),
                                    start_new_session=True)
            timed_out = _wait_or_kill(proc, deadline - time.monotonic())
        step = {"name": name, "rc": proc.returncode, "seconds": round(time.monotonic() - start, 1),
                "timed_out": timed_out, "problems": []}
        if name in trainers:
            trainer, plans = trainers[name]
            fold = scratch / "nnUNet_results" / f"Dataset{DATASET_ID:03d}_SyntheticPolyps" / f"{trainer}__{plans}__2d" \
                / "fold_0"
            logs = sorted(fold.glob("training_log_*.txt"))
            text = logs[-1].read_text(errors="replace") if logs else ""
            step["loss_terms"] = loss_terms(text)
            step["problems"] = check_training(text, (fold / "checkpoint_final.pth").is_file(),
                                              meddisseg=name.endswith("meddisseg"), epochs=3 if "MedDisSeg" in trainer
                                              else 1)
        if proc.returncode != 0:
            step["problems"].insert(0, f"exit code {proc.returncode}" + (" (time limit)" if timed_out else ""))
            step["log_tail"] = _tail(log, 40)
        results["steps"].append(step)
        if step["problems"]:
            results["status"] = "failed"
        _write(out, results)
        if proc.returncode != 0 and not name.startswith("train_"):
            break
    print((out / "ddp_smoke.md").read_text())
    return 0 if results["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
