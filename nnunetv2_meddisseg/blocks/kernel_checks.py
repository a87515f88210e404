"""Accuracy checks of the fused kernels against their reference forms, on any device, without pytest.

Each check draws fresh random inputs (never zeros), runs the fused form and its float64 reference and returns
the relative errors of values and gradients (random upstream gradients): the CDFA ops and block against the
shifted form, TeLU, and ``instance_norm_channels_last``, in fp32 / bf16 / fp16. Outputs the CDFA ops allocate
are NaN-filled first, so an unwritten element shows; a non-finite result fails. The Triton kernels run on CUDA,
and on the CPU under ``TRITON_INTERPRET=1`` (set before Triton's first import); elsewhere their checks say why.
``python -m nnunetv2_meddisseg.blocks.kernel_checks [--device cuda]`` prints one line per check, exits 1 on a failure.
"""
import argparse
import contextlib
import math
import sys
import time
import traceback
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nnunetv2_meddisseg.blocks import activation, cdfa_kernels, norm, telu_kernels
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, displacement_sum, window_displacement_weights
from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of

__all__ = ["TOLERANCE", "relative_error", "poisoned_outputs", "reference_offset_weights", "reference_aggregate",
           "check_cdfa_ops", "check_cdfa_block", "check_telu", "check_instance_norm", "run_checks"]

#: largest relative error accepted per dtype of the fused form's inputs
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def relative_error(ours: Tensor, ref: Tensor) -> float:
    """``||ours - ref|| / ||ref||`` in float64; raises if ``ours`` has a non-finite (e.g. unwritten) element."""
    if not bool(torch.isfinite(ours).all()):
        raise AssertionError("an output element was not written (NaN) or is not finite")
    ref = ref.detach().double()
    return float((ours.detach().double() - ref).norm() / ref.norm())


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Within the context, every output the CDFA ops allocate is NaN-filled before their kernels write it."""
    allocate = cdfa_kernels._new_output

    def poisoned(*args, **kwargs):
        return allocate(*args, **kwargs).fill_(float("nan"))

    cdfa_kernels._new_output = poisoned
    try:
        yield
    finally:
        cdfa_kernels._new_output = allocate


def reference_offset_weights(logits: Tensor, scale: float, heads: int, k: int) -> Tensor:
    """The shifted form of ``window_offset_weights``: (B, heads*k^4, H, W) -> (B, heads, (2k-1)^2, H, W)."""
    b, _, h, w = logits.shape
    weights = torch.softmax(scale * logits.reshape(b, heads, k * k, k * k, h, w), dim=3)
    return window_displacement_weights(weights, k).reshape(b, heads, (2 * k - 1) ** 2, h, w)


def reference_aggregate(values: Tensor, weights: Tensor) -> Tensor:
    """The shifted form of ``offset_aggregate``: (B, heads*D, H, W), (B, heads, S*S, H, W) -> (B, heads*D, H, W)."""
    b, heads, offsets, h, w = weights.shape
    span = math.isqrt(offsets)
    return displacement_sum(values, weights.reshape(b, heads, span, span, h, w))


def _float64(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64, memory_format=torch.contiguous_format).requires_grad_()


def _randn(shape, dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=generator, dtype=torch.float32, device=device).to(dtype)


def _generator(device: torch.device) -> torch.Generator:
    """A generator on ``device`` with a fresh seed (new inputs every run)."""
    return torch.Generator(device=device).manual_seed(int(torch.randint(0, 2 ** 31, (1,))))


def check_cdfa_ops(device: torch.device, dtype: torch.dtype, channels_last: bool, heads: int = 4,
                   head_dim: int = 32, size: Tuple[int, int] = (37, 41), k: int = 3) -> Dict[str, float]:
    """The chained fused CDFA ops against the float64 shifted form: errors of the output and both gradients."""
    scale = head_dim ** -0.5
    gen = _generator(device)
    logits = (2 * _randn((2, heads * k ** 4, *size), torch.float32, device, gen)).to(dtype)
    values = _randn((2, heads * head_dim, *size), dtype, device, gen)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    logits = logits.contiguous(memory_format=fmt).requires_grad_()
    values = values.contiguous(memory_format=fmt).requires_grad_()
    with poisoned_outputs():
        out = cdfa_kernels.offset_aggregate(values, cdfa_kernels.window_offset_weights(logits, scale, heads, k))
        upstream = _randn(tuple(out.shape), dtype, device, gen)
        grads = torch.autograd.grad(out, (logits, values), upstream)
    l64, v64 = _float64(logits), _float64(values)
    ref = reference_aggregate(v64, reference_offset_weights(l64, scale, heads, k))
    ref_grads = torch.autograd.grad(ref, (l64, v64), upstream.double())
    if out.stride() != values.stride() or grads[0].stride() != logits.stride():
        raise AssertionError("the fused ops did not keep the inputs' layout")
    return {"out": relative_error(out, ref), "grad_logits": relative_error(grads[0], ref_grads[0]),
            "grad_values": relative_error(grads[1], ref_grads[1])}


def check_cdfa_block(device: torch.device, compiled: bool = False, dim: int = 64, heads: int = 4,
                     size: Tuple[int, int] = (24, 20)) -> Dict[str, float]:
    """Largest error of ``ContrastDrivenAggregation``'s output and gradients, fused (eager or compiled) vs shifted."""
    gen = _generator(device)
    m = ContrastDrivenAggregation(dim, dim, heads).to(device).train()
    inputs = [_randn((2, dim, *size), torch.float32, device, gen) for _ in range(3)]
    upstream = _randn((2, dim, *size), torch.float32, device, gen)

    def run(form: str, module: Optional[Callable] = None) -> List[Tensor]:
        leaves = [t.clone().requires_grad_() for t in inputs]
        with implementation_form_of(m, form):
            out = (module or m)(*leaves)
        return [out, *torch.autograd.grad(out, [*leaves, *m.parameters()], upstream)]

    reference = run("shifted")
    module = None
    if compiled:
        torch._dynamo.reset()
        module = torch.compile(m, fullgraph=True)
    with poisoned_outputs():
        fused = run("fused", module)
    return {"max_over_output_and_gradients": max(relative_error(a, b) for a, b in zip(fused, reference))}


def check_telu(device: torch.device, dtype: torch.dtype, channels_last: bool,
               shape: Tuple[int, ...] = (4, 32, 37, 41)) -> Dict[str, float]:
    """The TeLU kernel's value and slope vs float64 TeLU, with the far left, 0, the clamp and past fp16's exp range."""
    gen = _generator(device)
    x = _randn(shape, torch.float32, device, gen) * 5
    x.view(-1)[:4] = torch.tensor([-30.0, 0.0, 4.0, 11.0], device=device)
    x = x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    result = telu_kernels.telu_triton(x, with_slope=True)
    if result is None:
        raise AssertionError("the TeLU kernel failed to run (see the warning)")
    y, slope = result
    if y.dtype != dtype or y.stride() != x.stride() or slope.stride() != x.stride():
        raise AssertionError("the TeLU kernel did not keep the input's dtype and layout")
    ref_y, ref_slope = activation._telu_and_slope(x.double())
    return {"out": relative_error(y, ref_y), "slope": relative_error(slope, ref_slope)}


def check_instance_norm(device: torch.device, dtype: torch.dtype, shape: Tuple[int, ...] = (4, 32, 37, 41)
                        ) -> Dict[str, float]:
    """``instance_norm_channels_last`` (affine) vs float64 ``F.instance_norm``: errors of output and gradients."""
    gen = _generator(device)
    x = (_randn(shape, torch.float32, device, gen) * 3 + 1).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    weight = (_randn(shape[1:2], torch.float32, device, gen) + 1).requires_grad_()
    bias = _randn(shape[1:2], torch.float32, device, gen).requires_grad_()
    out = norm.instance_norm_channels_last(x, weight, bias, 1e-5)
    if out.dtype != dtype or out.stride() != x.stride():
        raise AssertionError("instance_norm_channels_last did not keep the input's dtype and layout")
    upstream = _randn(tuple(out.shape), dtype, device, gen)
    grads = torch.autograd.grad(out, (x, weight, bias), upstream)
    leaves = [_float64(t) for t in (x, weight, bias)]
    ref = F.instance_norm(leaves[0], weight=leaves[1], bias=leaves[2], eps=1e-5)
    ref_grads = torch.autograd.grad(ref, leaves, upstream.double())
    errors = {"out": relative_error(out, ref)}
    errors.update({f"grad_{n}": relative_error(g, r) for n, g, r in zip(("x", "weight", "bias"), grads, ref_grads)})
    return errors


def planned_checks(device: torch.device, small: bool = False, compiled: bool = True
                   ) -> List[Tuple[str, str, Callable[[], Dict[str, float]], float]]:
    """(kernel, check name, check, tolerance) of every check; ``small``: small sizes for Triton's CPU interpreter."""
    ops, shape = (dict(heads=2, head_dim=8, size=(7, 9)), (2, 8, 7, 9)) if small else ({}, (4, 32, 37, 41))
    plan = []
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        for channels_last in (False, True):
            layout = "channels_last" if channels_last else "nchw"
            plan.append(("cdfa", f"ops_{name}_{layout}",
                         lambda d=dtype, c=channels_last: check_cdfa_ops(device, d, c, **ops), TOLERANCE[dtype]))
            plan.append(("telu", f"{name}_{layout}",
                         lambda d=dtype, c=channels_last: check_telu(device, d, c, shape), TOLERANCE[dtype]))
        plan.append(("instance_norm_channels_last", name,
                     lambda d=dtype: check_instance_norm(device, d, shape), TOLERANCE[dtype]))
    block = dict(dim=8, heads=2, size=(6, 5)) if small else {}
    plan.append(("cdfa", "block_fused_vs_shifted_eager", lambda: check_cdfa_block(device, False, **block), 1e-3))
    if compiled:
        plan.append(("cdfa", "block_fused_vs_shifted_compiled", lambda: check_cdfa_block(device, True, **block),
                     1e-3))
    return plan


def unavailable(kernel: str, device: torch.device) -> Optional[str]:
    """Why ``kernel``'s fused form cannot run on ``device`` (None where it can)."""
    probe = torch.empty(1, device=device)
    if kernel == "cdfa" and not cdfa_kernels.fused_cdfa_available(probe):
        return "the fused CDFA ops need Triton and a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
    if kernel == "telu" and not telu_kernels.telu_triton_available(probe):
        return "the TeLU kernel needs Triton and a CUDA device (or TRITON_INTERPRET=1 on the CPU)"
    return None


def run_checks(device: torch.device, small: bool = False, compiled: bool = True,
               report: Optional[Callable[[str, dict], None]] = None) -> Dict[str, Dict[str, dict]]:
    """Run ``planned_checks``: ``{kernel: {check: {"errors", "tolerance", "passed", "seconds"}}}``; a raising check
    has ``"passed": False`` and ``"error"``, one that cannot run ``"skipped"``. ``report(path, record)`` after each."""
    results: Dict[str, Dict[str, dict]] = {}
    for kernel, name, check, tolerance in planned_checks(device, small, compiled):
        why = unavailable(kernel, device)
        if why is not None:
            record = {"skipped": why}
        else:
            start = time.perf_counter()
            try:
                errors = check()
                record = {"errors": errors, "tolerance": tolerance,
                          "passed": all(e < tolerance for e in errors.values())}
            except Exception as error:  # reported per check: the others still run
                record = {"passed": False, "error": traceback.format_exception_only(type(error), error)[-1].strip()}
            record["seconds"] = round(time.perf_counter() - start, 2)
        results.setdefault(kernel, {})[name] = record
        if report is not None:
            report(f"{kernel}/{name}", record)
    return results


def _print(path: str, record: dict) -> None:
    if "skipped" in record:
        print(f"{path}: skipped ({record['skipped']})", flush=True)
    elif "error" in record:
        print(f"{path}: FAILED ({record['error']})", flush=True)
    else:
        worst = max(record["errors"].values())
        print(f"{path}: {'passed' if record['passed'] else 'FAILED'} (largest relative error {worst:.2e}, "
              f"tolerance {record['tolerance']:.0e})", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="small sizes (for Triton's interpreter on the CPU)")
    p.add_argument("--no_compile", action="store_true", help="leave out the block under torch.compile")
    args = p.parse_args(argv)
    results = run_checks(torch.device(args.device), args.small, not args.no_compile, _print)
    failed = [f"{k}/{n}" for k, checks in results.items() for n, r in checks.items() if r.get("passed") is False]
    print(f"{len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
