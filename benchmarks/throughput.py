"""Forward-only inference throughput of Med-DisSeg vs the 2d networks nnU-Net plans for the same data.

All networks are timed in alternating rounds in one run, after warm-up, and
the median per candidate is reported, so that the ratios stay meaningful on a noisy machine. A
``torch.profiler`` breakdown of Med-DisSeg follows.

fp32, for the CPU; on CUDA, ``benchmarks/gpu.py`` measures inference in fp32 and bf16 + channels-last, eager and
compiled.

Usage: ``python benchmarks/throughput.py [--batch 4] [--size 256] [--repeats N] [--threads N]``
"""
import argparse
import os
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch import nn

from common import (DEFAULT_OUT, NETWORK_NAMES, alternating_timings, build_network, command_line, machine_info,
                    markdown_table, parse_device, set_mode, summarize, synchronize, write_results)

def _forward(net: nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """A no-argument function running one inference forward of ``net``."""
    def run() -> object:
        with torch.inference_mode():
            return net(x)

    return run


def profile_network(net: nn.Module, x: torch.Tensor, device: torch.device, rows: int = 15, repeats: int = 3) -> dict:
    """Top operators (torch.profiler, self time, one forward) and wall time per top-level part (median
    of ``repeats`` forwards)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.inference_mode():
        net(x)
        with profile(activities=activities) as prof:
            net(x)
            synchronize(device)
    averages = list(prof.key_averages())
    key = "self_cpu_time_total"
    if device.type == "cuda":  # renamed in recent torch versions
        key = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
    events = sorted(averages, key=lambda e: getattr(e, key, 0), reverse=True)
    total = sum(getattr(e, key, 0) for e in events) or 1
    top = [{"op": e.key, "self_ms": getattr(e, key, 0) / 1e3, "share": getattr(e, key, 0) / total, "calls": e.count}
           for e in events[:rows]]

    parts: Dict[str, float] = {}
    handles = []
    for name, module in net.named_children():
        children = list(module.children()) if isinstance(module, (nn.ModuleList, nn.ModuleDict)) else [module]
        for i, child in enumerate(children):
            label = name if len(children) == 1 else f"{name}.{i}"

            def pre(_m, _i, label=label):
                synchronize(device)
                parts[label] = parts.get(label, 0.0) - time.perf_counter()

            def post(_m, _i, _o, label=label):
                synchronize(device)
                parts[label] += time.perf_counter()

            handles += [child.register_forward_pre_hook(pre), child.register_forward_hook(post)]
    runs: List[Dict[str, float]] = []
    walls = []
    with torch.inference_mode():
        for _ in range(repeats):
            parts.clear()
            synchronize(device)
            start = time.perf_counter()
            net(x)
            synchronize(device)
            walls.append(time.perf_counter() - start)
            runs.append(dict(parts))
    for h in handles:
        h.remove()
    parts = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    wall = statistics.median(walls)
    return {"top_ops": top, "part_seconds": parts, "forward_seconds": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image height = width")
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--device", default="cpu", help="cpu; on CUDA, gpu.py measures inference")
    p.add_argument("--networks", nargs="+", default=list(NETWORK_NAMES), choices=NETWORK_NAMES)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for throughput.json / .md")
    args = p.parse_args(argv)

    device = parse_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    nets = {name: set_mode(build_network(name).to(device), training=False, deep_supervision=False)
            for name in args.networks}

    fns = {f"{name} / fp32": _forward(net, x) for name, net in nets.items()}
    times = alternating_timings(fns, args.repeats, args.warmup, device)
    stats = {k: summarize(v) for k, v in times.items()}
    for k, s in stats.items():
        s["images_per_s"] = args.batch / s["median_s"]
    base = "MedDisSeg / fp32"
    payload = {"machine": machine_info(str(device)), "command": command_line(), "batch": args.batch,
               "size": args.size, "repeats": args.repeats, "warmup": args.warmup, "results": stats,
               "load_average_after": [round(v, 2) for v in os.getloadavg()]}
    if base in stats:
        payload["ratios_vs_meddisseg_fp32"] = {k: stats[base]["median_s"] / s["median_s"] for k, s in stats.items()}
    if not args.no_profile and "MedDisSeg" in nets:
        payload["profile_meddisseg"] = profile_network(nets["MedDisSeg"], x, device)
    files = write_results(args.out, "throughput", payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    return 0


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


def _markdown(payload: dict) -> str:
    b, size = payload["batch"], payload["size"]
    out = [f"Forward-only inference (eval, deep supervision off, `torch.inference_mode`), batch {b}, "
           f"{size}x{size}, 3 channels; {payload['warmup']} warm-up + {payload['repeats']} timed rounds, all "
           f"candidates alternating in each round; median. Load average after the run: "
           f"{payload['load_average_after']}.", ""]
    ratios = payload.get("ratios_vs_meddisseg_fp32", {})
    rows = [[k, _ms(s["median_s"]), f"{_ms(s['q1_s'])}-{_ms(s['q3_s'])}", f"{s['images_per_s']:.2f}",
             f"{ratios[k]:.2f}" if k in ratios else "n/a"] for k, s in payload["results"].items()]
    out.append(markdown_table(["network / variant", "median ms/batch", "IQR ms", "images/s",
                               "speed vs MedDisSeg fp32"], rows))
    if "profile_meddisseg" in payload:
        prof, title = payload["profile_meddisseg"], "MedDisSeg"
        wall = prof["forward_seconds"]
        out += ["", f"## Profile: {title} (forward {_ms(wall)} ms, median of 3; operators of one forward)", "",
                markdown_table(["part", "ms", "share"],
                               [[k, _ms(v), f"{v / wall:.1%}"] for k, v in
                                sorted(prof["part_seconds"].items(), key=lambda kv: -kv[1])]), "",
                markdown_table(["operator", "self ms", "share", "calls"],
                               [[o["op"], f"{o['self_ms']:.1f}", f"{o['share']:.1%}", o["calls"]]
                                for o in prof["top_ops"]])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
