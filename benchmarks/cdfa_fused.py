"""Check and time the fused CDFA window attention (``blocks.cdfa_kernels``) on a CUDA GPU.

1. The two ops against the float64 shifted form (``window_displacement_weights`` of the softmaxed logits,
   ``displacement_sum``), values and gradients, in fp32 / bf16 / fp16, NCHW and channels_last
   (relative error ||ours - ref|| / ||ref||).
2. The whole ``ContrastDrivenAggregation`` block in the fused form against its shifted form (training mode,
   output and parameter gradients), eager and ``torch.compile(fullgraph=True)`` (inductor).
3. The time of the block's forward + backward in each form (fused, shifted, few_op), eager, channels_last,
   under bf16 autocast (CUDA events, median of the rounds).

Usage: ``python benchmarks/cdfa_fused.py [--size 128] [--batch 4] [--dim 128] [--heads 4] [--rounds 20]
[--out FOLDER]`` (writes ``cdfa_fused.json`` there). Needs Triton and a CUDA device.
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, displacement_sum, window_displacement_weights
from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available, offset_aggregate, window_offset_weights
from nnunetv2_meddisseg.blocks.device_forms import FORMS, forced_form


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double()
    return float((ours.detach().double() - ref).norm() / ref.norm())


def check_ops(device, heads=4, head_dim=32, size=(37, 41), k=3, scale=32 ** -0.5):
    """{case: {output: relative error}} of both ops against the float64 shifted form."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for channels_last in (False, True):
            gen = torch.Generator(device=device).manual_seed(0)
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            logits = (2 * torch.randn(2, heads * k ** 4, *size, device=device, generator=gen)).to(dtype)
            values = torch.randn(2, heads * head_dim, *size, device=device, generator=gen).to(dtype)
            logits = logits.contiguous(memory_format=fmt).requires_grad_()
            values = values.contiguous(memory_format=fmt).requires_grad_()
            out = offset_aggregate(values, window_offset_weights(logits, scale, heads, k))
            l64, v64 = (t.detach().double().contiguous().requires_grad_() for t in (logits, values))
            b, _, h, w = l64.shape
            weights = torch.softmax(scale * l64.view(b, heads, k * k, k * k, h, w), dim=3)
            d64 = window_displacement_weights(weights, k)
            ref = displacement_sum(v64, d64)
            upstream = torch.randn(out.shape, device=device, generator=gen).to(dtype)
            grads = torch.autograd.grad(out, (logits, values), upstream)
            ref_grads = torch.autograd.grad(ref, (l64, v64), upstream.double())
            results[f"{str(dtype)[6:]}-{'channels_last' if channels_last else 'nchw'}"] = {
                "out": _rel(out, ref), "grad_logits": _rel(grads[0], ref_grads[0]),
                "grad_values": _rel(grads[1], ref_grads[1]),
                "layout_kept": out.stride() == values.stride() and grads[0].stride() == logits.stride()}
    return results


def _block_run(m, inputs, upstream, form, compiled=None):
    inputs = [t.clone().requires_grad_() for t in inputs]
    with forced_form(form):
        out = (compiled or m)(*inputs)
    grads = torch.autograd.grad(out, [*inputs, *m.parameters()], upstream)
    return [out, *grads]


def check_block(device, dim=64, heads=4, size=(24, 20)):
    """{"eager" | "compiled": largest relative error over output and gradients} of fused vs shifted."""
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(dim, dim, heads).to(device).train()
    inputs = [torch.randn(2, dim, *size, device=device) for _ in range(3)]
    upstream = torch.randn(2, dim, *size, device=device)
    ref = _block_run(m, inputs, upstream, "shifted")
    results = {"eager": max(_rel(a, b) for a, b in zip(_block_run(m, inputs, upstream, "fused"), ref))}
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    results["compiled"] = max(_rel(a, b) for a, b in zip(_block_run(m, inputs, upstream, "fused", compiled), ref))
    return results


def time_forms(device, batch, dim, heads, size, rounds):
    """{form: median milliseconds} of the block's forward + backward (bf16 autocast, channels_last)."""
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(dim, dim, heads).to(device).to(memory_format=torch.channels_last).train()
    inputs = [torch.randn(batch, dim, size, size, device=device).contiguous(memory_format=torch.channels_last)
              .requires_grad_() for _ in range(3)]
    times = {}
    for form in FORMS:
        samples = []
        for r in range(rounds + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            with forced_form(form), torch.autocast("cuda", dtype=torch.bfloat16):
                out = m(*inputs)
            out.float().mean().backward()
            end.record()
            torch.cuda.synchronize()
            if r >= 3:
                samples.append(start.elapsed_time(end))
        times[form] = statistics.median(samples)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    if not fused_cdfa_available(torch.empty(0, device=device)):
        print("the fused CDFA ops are not available here (Triton missing)")
        return 1
    import triton

    payload = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
    payload["ops"] = check_ops(device)
    for case, errors in payload["ops"].items():
        print(case, {k: (f"{v:.1e}" if isinstance(v, float) else v) for k, v in errors.items()}, flush=True)
    payload["block"] = check_block(device)
    print("block fused vs shifted (largest relative error):", payload["block"], flush=True)
    payload["ms"] = time_forms(device, args.batch, args.dim, args.heads, args.size, args.rounds)
    print(f"block forward + backward, batch {args.batch}, {args.dim} channels, {args.size}x{args.size}, bf16, ms:",
          {k: round(v, 3) for k, v in payload["ms"].items()}, flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cdfa_fused.json").write_text(json.dumps(payload, indent=1))
    ok = all(v["out"] < 1e-2 and v["grad_logits"] < 1e-2 and v["grad_values"] < 1e-2 for v in payload["ops"].values())
    return 0 if ok and max(payload["block"].values()) < 1e-3 and not math.isnan(max(payload["ms"].values())) else 1


if __name__ == "__main__":
    sys.exit(main())
