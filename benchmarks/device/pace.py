"""Kernel launches and throughput of Med-DisSeg on one device, current vs previous block implementations.

``python benchmarks/device/pace.py OUT.json [--device cuda] [--size 256] [--batch 0] [--infer-batches 4 32]
[--repeats 10] [--budget-s 170] [--no-compile]``

Measured in one process, in this order, each part skipped (with the reason recorded) once the time
left is too short, and OUT.json rewritten after every part, so that a run cut short keeps what it
measured:

1. ``profiles``: ``torch.profiler`` of one Med-DisSeg Stage II training step at SIZE x SIZE (forward
   with deep supervision, the trainer's Stage II loss, backward, Adam step; batch ``--batch``, 0: the
   batch size ``nnUNetv2_meddisseg_plan`` plans) and of one inference forward at each of
   ``--infer-batches``: the number of kernel launches (CUDA kernel events; on the CPU the aten
   operations) and the 15 kernels with the most self time, for the ``previous`` implementations
   (``common.use_previous_implementations``) and the ``current`` ones, eager and ``torch.compile``d.
2. ``throughput``: training images/s (fp32, bf16 autocast, compiled) and inference images/s at each
   batch (fp32, bf16 autocast, compiled) of the current implementations, median of ``--repeats``
   calls after warm-up, beside the targets (training >= 70 images/s at 256x256, inference >= 300 at
   batch 4).
"""
import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))

TARGETS = {"training_images_per_s": 70.0, "inference_batch4_images_per_s": 300.0}
TOP_KERNELS = 15


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _plan_batch(size: int) -> int:
    """The batch size ``nnUNetv2_meddisseg_plan`` plans for a size x size patch (8 GB target)."""
    from nnunetv2_meddisseg.planning.plan_meddisseg import estimate_batch_size

    return estimate_batch_size((size, size), 8.0)


def _networks(device):
    from common import build_network, use_previous_implementations

    import torch

    torch.manual_seed(0)
    current = build_network("MedDisSeg").to(device)
    previous = use_previous_implementations(copy.deepcopy(current))
    return {"current": current, "previous": previous}


def _training_step(net, x, target, amp, compiled: bool):
    """One Stage II step (``train_step.Stage2Loss`` with the dispersive term, Adam) as a no-argument function."""
    import torch
    from train_step import Stage2Loss

    net = copy.deepcopy(net).train()
    net.decoder.deep_supervision = True
    loss = Stage2Loss(dispersive=True).to(x.device)
    forward = torch.compile(net) if compiled else net
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            value = loss(forward(x), target)
        value.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 12)
        optimizer.step()
        return value.detach()
    return step


def _inference(net, x, amp, compiled: bool):
    import torch

    net = copy.deepcopy(net).eval()
    net.decoder.deep_supervision = False
    forward = torch.compile(net) if compiled else net

    def run():
        with torch.inference_mode(), torch.autocast(x.device.type, dtype=torch.bfloat16) if amp else \
                contextlib.nullcontext():
            return forward(x)
    return run


def _inside_aten(event) -> bool:
    """Whether a profiler event runs inside another aten operation (the backward's operations run
    inside autograd's engine events, not inside aten ones, so they count)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def profile(fn, device) -> dict:
    """Kernel launches and the top kernels of one call of ``fn`` (after it ran once)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        _synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        unit = "CUDA kernel launches"
    else:
        kernels = [e for e in events if e.name.startswith("aten::") and not _inside_aten(e)]
        unit = "outermost aten operations, backward included (CPU)"
    totals = {}
    for e in kernels:
        t = e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total
        name = e.name[:120]
        calls, time_us = totals.get(name, (0, 0.0))
        totals[name] = (calls + 1, time_us + t)
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return {"launches": len(kernels), "unit": unit, "total_ms": sum(v[1] for v in totals.values()) / 1e3,
            "top": [{"name": n, "calls": c, "self_ms": t / 1e3} for n, (c, t) in top]}


def timed(fn, device, repeats: int) -> float:
    """Median seconds per call (after the calls already made)."""
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="JSON file written after every part")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=0, help="training batch (0: the planned batch size)")
    p.add_argument("--infer-batches", type=int, nargs="+", default=[4, 32])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=170)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    import torch

    from common import machine_info, parse_device
    from train_step import make_batch

    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock(args.budget_s)
    device = parse_device(args.device)
    batch = args.batch or _plan_batch(args.size)
    result = {"machine": machine_info(str(device)), "size": args.size, "training_batch": batch,
              "infer_batches": args.infer_batches, "targets": TARGETS, "profiles": [], "throughput": [],
              "skipped": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write():
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    nets = _networks(device)
    x, target = make_batch(batch, args.size, device)
    inputs = {b: torch.randn(b, 3, args.size, args.size, device=device) for b in args.infer_batches}
    modes = [False] if args.no_compile else [False, True]
    prepared = {}
    # 1. profiles (the runs they prepare are reused for the timings)
    for compiled in modes:
        for impl in ("previous", "current"):
            cases = [("training_step", batch, lambda: _training_step(nets[impl], x, target, False, compiled))]
            cases += [("inference", b, (lambda b=b: _inference(nets[impl], inputs[b], False, compiled)))
                      for b in args.infer_batches]
            for what, b, make in cases:
                key = f"{what} batch {b} / {impl} / {'compiled' if compiled else 'eager'}"
                if clock.left() < (60 if compiled else 10):
                    result["skipped"][key] = f"{clock.left():.0f} s left"
                    continue
                try:
                    fn = make()
                    fn()  # compiles / allocates
                    fn()
                    result["profiles"].append({"what": what, "batch": b, "implementations": impl,
                                               "compiled": compiled, **profile(fn, device)})
                    if impl == "current":
                        prepared[(what, b, "compiled" if compiled else "fp32")] = fn
                except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
                    result["skipped"][key] = f"{type(e).__name__}: {e}"[:500]
                write()
    # 2. throughput of the current implementations
    for what, b in [("training_step", batch)] + [("inference", b) for b in args.infer_batches]:
        for variant in ("fp32", "bf16", "compiled"):
            key = f"{what} batch {b} / {variant}"
            if variant == "compiled" and args.no_compile:
                continue
            if clock.left() < 10:
                result["skipped"][key] = f"{clock.left():.0f} s left"
                continue
            fn = prepared.get((what, b, variant))
            try:
                if fn is None:
                    if variant == "compiled":
                        result["skipped"][key] = "not prepared (see the profiles)"
                        continue
                    net = nets["current"]
                    fn = (_training_step(net, x, target, True, False) if what == "training_step"
                          else _inference(net, inputs[b], variant == "bf16", False))
                    fn()
                seconds = timed(fn, device, args.repeats)
                result["throughput"].append({"what": what, "batch": b, "variant": variant, "median_s": seconds,
                                             "images_per_s": b / seconds})
            except Exception as e:  # noqa: BLE001
                result["skipped"][key] = f"{type(e).__name__}: {e}"[:500]
            write()
    result["seconds_left"] = round(clock.left(), 1)
    write()
    print(json.dumps({k: result[k] for k in ("throughput", "skipped")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
