"""Time and memory of one Med-DisSeg training step, with and without the dispersive loss.

One step = forward (train mode, deep supervision on: logits, path logits, fg/bg/uc maps, features),
the Stage II loss of nnUNetTrainerMedDisSeg (the trainer's own ``stage2_loss`` with its default
weights: nnU-Net's Dice+CE on the logits, mean Dice+CE of the three path logits, foreground/background
and complementarity terms, and the trainer's dispersive loss or not), backward and an Adam step. The
candidates run in alternating rounds on the same batch; the median is reported:

``without_dispersive`` / ``with_dispersive``: overhead ratio (target <= 3 %).

The dispersive loss (forward + backward) and ``dispersion_diagnostics`` (what the trainer computes on
the first step of each epoch) are also timed alone on the same features, which gives an overhead
estimate free of the noise of the full step.

Peak memory is measured in a fresh subprocess per configuration: peak RSS above the RSS before the first
step on CPU (VmHWM), or ``torch.cuda.max_memory_allocated`` on CUDA. Two batch sizes give the training bytes
per input pixel and sample (the slope: what the plan command's ``TRAINING_BYTES_PER_PIXEL`` estimates).

Usage: ``python benchmarks/train_step.py [--batch 4] [--size 256] [--repeats N] [--device cpu|cuda]``
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from common import (DEFAULT_OUT, alternating_timings, build_network, command_line, current_rss_bytes, machine_info,
                    markdown_table, parse_device, peak_rss_bytes, reset_peak_rss, set_mode, summarize, synchronize,
                    write_results)

OVERHEAD_TARGET = 0.03  # target: dispersive loss overhead <= 3 % of a training step
GIB = 1024 ** 3


class Stage2Loss(nn.Module):
    """The Stage II loss of nnUNetTrainerMedDisSeg (its own ``stage2_loss`` with its default weights and
    dispersive settings), with or without the dispersive term."""

    def __init__(self, dispersive: bool) -> None:
        super().__init__()
        from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
        from nnunetv2_meddisseg.training.stage2_loss import Stage2Weights, dispersive_from_recipe, segmentation_loss

        self.seg = segmentation_loss(batch_dice=True)  # nnU-Net plans batch Dice for 2D
        self.weights = Stage2Weights.from_recipe(nnUNetTrainerMedDisSeg.recipe)
        self.dispersive = dispersive_from_recipe(nnUNetTrainerMedDisSeg.recipe) if dispersive else None

    def forward(self, output, target: Tensor) -> Tensor:
        from nnunetv2_meddisseg.training.stage2_loss import stage2_loss

        return stage2_loss(output, target, self.seg, self.dispersive, self.weights)[0]


def make_step(net: nn.Module, loss: nn.Module, x: Tensor, target: Tensor, amp: bool) -> Callable[[], float]:
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            value = loss(net(x), target)
        value.backward()
        optimizer.step()
        return value.detach()

    return step


def make_batch(batch: int, size: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    radius = torch.rand(batch, generator=g) * size / 4 + size / 8
    target = ((yy - size / 2) ** 2 + (xx - size / 2) ** 2)[None] < radius[:, None, None] ** 2
    return x.to(device), target[:, None].float().to(device)


def dispersive_alone(batch: int, size: int, repeats: int, device: torch.device) -> Dict[str, dict]:
    """Forward + backward of the dispersive loss, and the diagnostics, on features shaped like
    ``features['early']`` (B, 256, H/4, W/4)."""
    from nnunetv2_meddisseg.losses import DispersiveLoss, dispersion_diagnostics

    feats = torch.randn(batch, 256, size // 4, size // 4, device=device, requires_grad=True)
    loss = DispersiveLoss(placement="early", lambda_dispersive=0.6)

    def fwd_bwd():
        feats.grad = None
        loss({"early": feats}).backward()

    times = alternating_timings({"dispersive_forward_backward": fwd_bwd,
                                 "dispersion_diagnostics": lambda: dispersion_diagnostics(feats)},
                                repeats, warmup=1, device=device)
    return {k: summarize(v) for k, v in times.items()}


# --------------------------------------------------------------------------- memory (subprocess)

def memory_probe(batch: int, size: int, dispersive: bool, steps: int, device: torch.device, amp: bool) -> dict:
    """Peak memory of ``steps`` training steps in this (fresh) process."""
    torch.manual_seed(0)
    net = set_mode(build_network("MedDisSeg", deep_supervision=True).to(device), training=True,
                   deep_supervision=True)
    x, target = make_batch(batch, size, device)
    step = make_step(net, Stage2Loss(dispersive).to(device), x, target, amp)
    result = {"batch": batch, "size": size, "dispersive": dispersive, "steps": steps}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        for _ in range(steps):
            step()
        synchronize(device)
        result.update(kind="cuda max_memory_allocated", before_bytes=before,
                      peak_bytes=torch.cuda.max_memory_allocated(device))
    else:
        before = current_rss_bytes()
        result["peak_reset"] = reset_peak_rss()
        for _ in range(steps):
            step()
        result.update(kind="cpu peak RSS (VmHWM)", before_bytes=before, peak_bytes=peak_rss_bytes())
    result["peak_above_setup_bytes"] = result["peak_bytes"] - result["before_bytes"]
    return result


def run_memory_probe(args, batch: int, dispersive: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", "--batch", str(batch),
           "--size", str(args.memory_size), "--memory-steps", str(args.memory_steps), "--device", args.device]
    cmd += ["--dispersive"] if dispersive else []
    cmd += ["--bf16"] if args.bf16 else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        return {"batch": batch, "dispersive": dispersive,
                "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main

def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image height = width of the timed steps")
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (as nnU-Net trains on CUDA)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--memory-size", type=int, default=None, help="image size of the memory probes (default --size)")
    p.add_argument("--memory-batches", type=int, nargs="+", default=None,
                   help="batch sizes of the memory probes (default: 1 and --batch)")
    p.add_argument("--memory-steps", type=int, default=2)
    p.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for train_step.json / .md")
    # internal: one memory probe in this process
    p.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dispersive", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    device = parse_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.memory_size = args.memory_size or args.size

    if args.memory_probe:
        print(json.dumps(memory_probe(args.batch, args.memory_size, args.dispersive, args.memory_steps, device,
                                      args.bf16)))
        return 0

    machine = machine_info(str(device))
    torch.manual_seed(0)
    net = set_mode(build_network("MedDisSeg", deep_supervision=True).to(device), training=True, deep_supervision=True)
    x, target = make_batch(args.batch, args.size, device)
    candidates = {"without_dispersive": make_step(net, Stage2Loss(False).to(device), x, target, args.bf16),
                  "with_dispersive": make_step(net, Stage2Loss(True).to(device), x, target, args.bf16)}
    times = alternating_timings(candidates, args.repeats, args.warmup, device)
    stats = {k: summarize(v) for k, v in times.items()}
    base = stats["without_dispersive"]["median_s"]
    overhead = stats["with_dispersive"]["median_s"] / base - 1
    alone = dispersive_alone(args.batch, args.size, max(args.repeats, 20), device)
    overhead_alone = alone["dispersive_forward_backward"]["median_s"] / base
    payload = {"machine": machine, "command": command_line(), "batch": args.batch, "size": args.size,
               "bf16": args.bf16, "repeats": args.repeats, "warmup": args.warmup, "timings": stats,
               "dispersive_overhead_full_step": overhead, "dispersive_alone": alone,
               "dispersive_overhead_from_isolated_cost": overhead_alone,
               "diagnostics_share_of_step": alone["dispersion_diagnostics"]["median_s"] / base,
               "overhead_target": OVERHEAD_TARGET,
               "load_average_after": [round(v, 2) for v in os.getloadavg()]}
    del net, candidates

    if not args.no_memory:
        batches = sorted(set(args.memory_batches or [1, args.batch]))
        probes = [run_memory_probe(args, b, True) for b in batches]
        payload["memory"] = probes
        main_probes = [pr for pr in probes if pr.get("dispersive") and "error" not in pr]
        if len(main_probes) >= 2:
            lo, hi = main_probes[0], main_probes[-1]
            payload["training_bytes_per_pixel_per_sample"] = (
                (hi["peak_above_setup_bytes"] - lo["peak_above_setup_bytes"])
                / ((hi["batch"] - lo["batch"]) * args.memory_size ** 2))

    payload["overhead_target_met"] = overhead_alone <= OVERHEAD_TARGET
    files = write_results(args.out, "train_step", payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    if not payload["overhead_target_met"]:
        print(f"TARGET MISSED: dispersive loss costs {overhead_alone:.1%} of a step (> {OVERHEAD_TARGET:.0%})",
              file=sys.stderr)
        return 1
    return 0


def _markdown(payload: dict) -> str:
    t = payload["timings"]
    b, size = payload["batch"], payload["size"]
    out = [f"One training step (forward, Stage II loss, backward, Adam), batch {b}, {size}x{size}, "
           f"{'bf16 autocast' if payload['bf16'] else 'fp32'}; {payload['warmup']} warm-up + {payload['repeats']} "
           f"timed rounds, candidates alternating; median. Load average after the timing: "
           f"{payload['load_average_after']}.", "",
           markdown_table(["candidate", "median s/step", "IQR s"],
                          [[k, f"{s['median_s']:.3f}", f"{s['q1_s']:.3f}-{s['q3_s']:.3f}"] for k, s in t.items()]),
           ""]
    a = payload["dispersive_alone"]
    out += [f"- dispersive loss overhead, full steps compared: **{payload['dispersive_overhead_full_step']:+.2%}** "
            f"(noise of the step timings: IQR/median {_iqr(t['without_dispersive']):.1%})",
            f"- dispersive loss forward + backward alone: {a['dispersive_forward_backward']['median_s'] * 1e3:.2f} ms "
            f"= **{payload['dispersive_overhead_from_isolated_cost']:.3%}** of a step without it "
            f"(target <= {payload['overhead_target']:.0%}: "
            f"**{'met' if payload['overhead_target_met'] else 'MISSED'}**)",
            f"- `dispersion_diagnostics` (the trainer computes it on the first step of each epoch): "
            f"{a['dispersion_diagnostics']['median_s'] * 1e3:.2f} ms = {payload['diagnostics_share_of_step']:.3%} "
            f"of a step"]
    if "memory" in payload:
        out += ["", "## Peak memory", ""]
        rows = []
        for pr in payload["memory"]:
            if "error" in pr:
                rows.append([pr["batch"], pr.get("dispersive"), "error", pr["error"], ""])
                continue
            rows.append([pr["batch"], "yes" if pr["dispersive"] else "no", pr["kind"], f"{pr['peak_bytes'] / GIB:.2f}", f"{pr['peak_above_setup_bytes'] / GIB:.2f}"])
        size_m = payload["memory"][0].get("size", size)
        out.append(f"{payload['memory'][0].get('steps', '')} steps at {size_m}x{size_m} in a fresh process per row; "
                   "'above setup' excludes the process and model before the first step (includes gradients and "
                   "Adam moments).")
        out += ["", markdown_table(["batch", "dispersive", "measure", "peak GiB",
                                    "above setup GiB"], rows)]
        if "training_bytes_per_pixel_per_sample" in payload:
            out += ["", f"Training peak per input pixel and sample (slope between the batch sizes): "
                    f"**{payload['training_bytes_per_pixel_per_sample']:,.0f} bytes**."]
    return "\n".join(out) + "\n"


def _iqr(s: dict) -> float:
    return (s["q3_s"] - s["q1_s"]) / s["median_s"]


if __name__ == "__main__":
    raise SystemExit(main())
