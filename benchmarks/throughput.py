"""CPU forward-only inference throughput of Med-DisSeg vs the 2d networks nnU-Net plans for the same data.

All networks alternate in timed rounds after warm-up (medians), then ``torch.profiler`` breaks one forward of
Med-DisSeg down by block and operator. fp32 on the CPU; on CUDA, ``benchmarks/gpu.py`` measures inference.
"""
import torch
from common import (
    NETWORK_NAMES,
    alternating_timings,
    argument_parser,
    block_profile,
    build_network,
    command_line,
    load_average,
    machine_info,
    markdown_table,
    report,
    set_mode,
    summarize,
)


def main(argv=None) -> int:
    p = argument_parser(__doc__, "throughput")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image height = width")
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--networks", nargs="+", default=list(NETWORK_NAMES), choices=NETWORK_NAMES)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler breakdown")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    nets = {name: set_mode(build_network(name), training=False, deep_supervision=False) for name in args.networks}

    def forward(net):
        def run():
            with torch.inference_mode():
                return net(x)
        return run

    times = alternating_timings({f"{name} / fp32": forward(net) for name, net in nets.items()}, args.repeats,
                                args.warmup)
    stats = {k: summarize(v) for k, v in times.items()}
    for s in stats.values():
        s["images_per_s"] = args.batch / s["median_s"]
    base = "MedDisSeg / fp32"
    payload = {"machine": machine_info(), "command": command_line(), "batch": args.batch, "size": args.size,
               "repeats": args.repeats, "warmup": args.warmup, "results": stats, "load_average_after": load_average()}
    if base in stats:
        payload["ratios_vs_meddisseg_fp32"] = {k: stats[base]["median_s"] / s["median_s"] for k, s in stats.items()}
    if not args.no_profile and "MedDisSeg" in nets:
        payload["profile_meddisseg"] = block_profile(nets["MedDisSeg"], forward(nets["MedDisSeg"]), top=15)
    report(args.out, "throughput", payload, _markdown(payload))
    return 0


def _markdown(payload: dict) -> str:
    b, size = payload["batch"], payload["size"]
    out = [f"Forward-only inference (eval, deep supervision off, `torch.inference_mode`), batch {b}, "
           f"{size}x{size}, 3 channels; {payload['warmup']} warm-up + {payload['repeats']} timed rounds, all "
           f"candidates alternating in each round; median. Load average after the run: "
           f"{payload['load_average_after']}.", ""]
    ratios = payload.get("ratios_vs_meddisseg_fp32", {})
    rows = [[k, f"{s['median_s'] * 1e3:.1f}", f"{s['q1_s'] * 1e3:.1f}-{s['q3_s'] * 1e3:.1f}",
             f"{s['images_per_s']:.2f}", f"{ratios[k]:.2f}" if k in ratios else "n/a"]
            for k, s in payload["results"].items()]
    out.append(markdown_table(["network / variant", "median ms/batch", "IQR ms", "images/s",
                               "speed vs MedDisSeg fp32"], rows))
    if "profile_meddisseg" in payload:
        prof = payload["profile_meddisseg"]
        wall = prof["wall_ms"]
        out += ["", f"## Profile: MedDisSeg (one forward: wall {wall:.1f} ms, operators' self time "
                    f"{prof['kernel_ms']:.1f} ms)", "",
                markdown_table(["block", "ms", "share"], [[k, f"{v:.1f}", f"{v / wall:.1%}"] for k, v in
                                                          sorted(prof["per_block_ms"].items(), key=lambda kv: -kv[1])]),
                "", markdown_table(["operator", "self ms", "share", "calls"],
                                   [[o["name"], f"{o['ms']:.1f}", f"{o['ms'] / prof['kernel_ms']:.1%}", o["calls"]]
                                    for o in prof["top_kernels"]])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
