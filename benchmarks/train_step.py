"""Time and memory of one Med-DisSeg training step, with and without the dispersive loss (target: <= 3 %).

One step: forward (train mode, deep supervision), nnUNetTrainerMedDisSeg's Stage II loss, backward, Adam. The
two candidates alternate on the same batch (medians); the dispersive loss and ``dispersion_diagnostics`` are
also timed alone. Peak memory comes from a fresh subprocess per batch size; the slope between two batch sizes
is the training memory per input pixel and sample.
"""
import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from common import (
    alternating_timings,
    argument_parser,
    build_network,
    command_line,
    load_average,
    machine_info,
    make_batch,
    markdown_table,
    parse_device,
    report,
    reset_peak_rss,
    rss_bytes,
    set_mode,
    summarize,
    synchronize,
)
from torch import Tensor, nn

from nnunetv2_meddisseg.logged_command import run_logged_status
from nnunetv2_meddisseg.training.objectives import recipe_stage2_loss
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe

OVERHEAD_TARGET = 0.03  # target: dispersive loss overhead <= 3 % of a training step
GIB = 1024 ** 3


def make_step(net: nn.Module, loss: Callable, x: Tensor, target: Tensor, amp: bool) -> Callable[[], float]:
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            value = loss(net(x, output="all"), target)
        value.backward()
        optimizer.step()
        return value.detach()

    return step


def dispersive_alone(batch: int, size: int, repeats: int, device: torch.device) -> Dict[str, dict]:
    """Forward + backward of the dispersive loss, and the diagnostics, on features shaped like
    ``features['early']`` (B, 256, H/4, W/4)."""
    from nnunetv2_meddisseg.losses import DispersiveLoss, dispersion_diagnostics

    feats = torch.randn(batch, 256, size // 4, size // 4, device=device, requires_grad=True)
    loss = DispersiveLoss(placement="early")

    def fwd_bwd():
        feats.grad = None
        (0.6 * loss({"early": feats})).backward()

    times = alternating_timings({"dispersive_forward_backward": fwd_bwd,
                                 "dispersion_diagnostics": lambda: dispersion_diagnostics(feats)},
                                repeats, warmup=1, device=device)
    return {k: summarize(v) for k, v in times.items()}


def memory_probe(batch: int, size: int, steps: int, device: torch.device, amp: bool) -> dict:
    """Peak memory of ``steps`` training steps (dispersive loss included) in this fresh process."""
    torch.manual_seed(0)
    net = set_mode(build_network("MedDisSeg", deep_supervision=True).to(device), training=True, deep_supervision=True)
    x, target = make_batch(batch, size, device)
    step = make_step(net, recipe_stage2_loss(MedDisSegRecipe()), x, target, amp)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if cuda else rss_bytes()
    peak_reset = cuda or reset_peak_rss()
    for _ in range(steps):
        step()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) if cuda else rss_bytes(peak=True)
    return {"batch": batch, "size": size, "steps": steps, "peak_reset": peak_reset, "before_bytes": before,
            "kind": "cuda max_memory_allocated" if cuda else "cpu peak RSS (VmHWM)", "peak_bytes": peak,
            "peak_above_setup_bytes": peak - before}


def run_memory_probe(args, batch: int) -> dict:
    cmd = ["python", str(Path(__file__).resolve()), "--memory-probe", "--batch", str(batch),
           "--size", str(args.memory_size), "--memory-steps", str(args.memory_steps), "--device", args.device]
    cmd += ["--bf16"] if args.bf16 else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "probe.log"
        code, _ = run_logged_status(cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, log, echo=False)
        last = (log.read_text().strip().splitlines() or ["failed"])[-1]
    return json.loads(last) if code == 0 else {"batch": batch, "error": last}


def main(argv: Optional[List[str]] = None) -> int:
    p = argument_parser(__doc__, "train_step")
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
    p.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)  # one probe in this process
    args = p.parse_args(argv)
    device = parse_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.memory_size = args.memory_size or args.size

    if args.memory_probe:
        print(json.dumps(memory_probe(args.batch, args.memory_size, args.memory_steps, device, args.bf16)))
        return 0

    machine = machine_info(str(device))
    torch.manual_seed(0)
    net = set_mode(build_network("MedDisSeg", deep_supervision=True).to(device), training=True, deep_supervision=True)
    x, target = make_batch(args.batch, args.size, device)
    candidates = {"without_dispersive": make_step(net, recipe_stage2_loss(MedDisSegRecipe(), dispersive=False), x,
                                                  target, args.bf16),
                  "with_dispersive": make_step(net, recipe_stage2_loss(MedDisSegRecipe()), x, target, args.bf16)}
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
               "overhead_target": OVERHEAD_TARGET, "load_average_after": load_average()}
    del net, candidates

    if not args.no_memory:
        batches = sorted(set(args.memory_batches or [1, args.batch]))
        payload.update(memory_size=args.memory_size, memory_steps=args.memory_steps,
                       memory=[run_memory_probe(args, b) for b in batches])
        measured = [pr for pr in payload["memory"] if "error" not in pr]
        if len(measured) >= 2:
            lo, hi = measured[0], measured[-1]
            payload["training_bytes_per_pixel_per_sample"] = (
                (hi["peak_above_setup_bytes"] - lo["peak_above_setup_bytes"])
                / ((hi["batch"] - lo["batch"]) * args.memory_size ** 2))

    payload["overhead_target_met"] = overhead_alone <= OVERHEAD_TARGET
    missed = f"dispersive loss costs {overhead_alone:.1%} of a step (> {OVERHEAD_TARGET:.0%})"
    return report(args.out, "train_step", payload, _markdown(payload),
                  None if payload["overhead_target_met"] else missed)


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
    a, base = payload["dispersive_alone"], t["without_dispersive"]
    iqr = (base["q3_s"] - base["q1_s"]) / base["median_s"]
    out += [f"- dispersive loss overhead, full steps compared: **{payload['dispersive_overhead_full_step']:+.2%}** "
            f"(noise of the step timings: IQR/median {iqr:.1%})",
            f"- dispersive loss forward + backward alone: {a['dispersive_forward_backward']['median_s'] * 1e3:.2f} ms "
            f"= **{payload['dispersive_overhead_from_isolated_cost']:.3%}** of a step without it "
            f"(target <= {payload['overhead_target']:.0%}: "
            f"**{'met' if payload['overhead_target_met'] else 'MISSED'}**)",
            f"- `dispersion_diagnostics` (the trainer computes it on the first step of each epoch): "
            f"{a['dispersion_diagnostics']['median_s'] * 1e3:.2f} ms = {payload['diagnostics_share_of_step']:.3%} "
            f"of a step"]
    if "memory" in payload:
        out += ["", "## Peak memory", ""]
        rows = [[pr["batch"], "error", pr["error"], ""] if "error" in pr else
                [pr["batch"], pr["kind"], f"{pr['peak_bytes'] / GIB:.2f}", f"{pr['peak_above_setup_bytes'] / GIB:.2f}"]
                for pr in payload["memory"]]
        size_m, steps = payload["memory_size"], payload["memory_steps"]
        out += [f"{steps} steps at {size_m}x{size_m} (dispersive loss included) in a fresh process per row; "
                "'above setup' excludes the process and model before the first step (includes gradients and Adam "
                "moments).", "", markdown_table(["batch", "measure", "peak GiB", "above setup GiB"], rows)]
        if "training_bytes_per_pixel_per_sample" in payload:
            out += ["", f"Training peak per input pixel and sample (slope between the batch sizes): "
                    f"**{payload['training_bytes_per_pixel_per_sample']:,.0f} bytes**."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
