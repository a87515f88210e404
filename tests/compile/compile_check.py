"""Run a module eagerly and under ``torch.compile`` (inductor) and compare outputs, gradients and buffers.

Each side gets its own deep copy of the module, so in-place buffer updates (BatchNorm running
statistics in training mode) are compared too. Gradients are taken of ``sum_k <out_k, w_k>`` with
fixed random cotangents ``w_k``, with respect to every parameter and every input that requires one.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch._dynamo
from torch import Tensor, nn
from torch._inductor.compile_fx import compile_fx


def flatten_tensors(obj) -> List[Tensor]:
    """Every tensor in a (nested) tuple / list / NamedTuple / dict, in a fixed order; None skipped."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for key in sorted(obj) for t in flatten_tensors(obj[key])]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in flatten_tensors(item)]
    return []


class CountingInductor:
    """Inductor as the backend, counting the graphs it is handed (a silent fall-back to eager, e.g.
    after too many recompilations, would otherwise make every comparison pass trivially)."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs += 1
        return compile_fx(gm, example_inputs)


def _run(fn: Callable, module: Optional[nn.Module], inputs: Sequence, seed: int):
    """outputs (detached), gradients (params then inputs), buffers of one side."""
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, Tensor) else x for x in inputs]
    outputs = flatten_tensors(fn(*leaves))
    params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    wrt = params + [x for x in leaves if isinstance(x, Tensor) and x.requires_grad]
    grads: List[Optional[Tensor]] = []
    if wrt:
        g = torch.Generator().manual_seed(seed)
        cotangents = [torch.randn(o.shape, generator=g, dtype=torch.float32) for o in outputs]
        total = sum((o.float() * w).sum() for o, w in zip(outputs, cotangents) if o.requires_grad)
        # a parameter the callable does not use gets None (on both sides, compared below)
        grads = list(torch.autograd.grad(total, wrt, allow_unused=True))
    buffers = [b.detach().clone() for b in module.buffers()] if module is not None else []
    return [o.detach() for o in outputs], grads, buffers


def compare_compiled(
    make_fn: Callable[[Optional[nn.Module]], Callable],
    module: Optional[nn.Module],
    inputs: Sequence,
    rtol: float,
    atol: float,
    seed: int = 0,
) -> Dict[str, int]:
    """Assert that ``torch.compile(make_fn(copy))`` matches ``make_fn(copy)`` run eagerly.

    make_fn: builds the callable from (a copy of) ``module``; e.g. ``lambda m: m`` or
    ``lambda m: partial(m, output_size=(32, 32))``. ``atol`` is multiplied by max(1, largest |value|) of
    each compared tensor. Returns counts for further checks:
    ``graphs`` (graphs inductor compiled), ``outputs``, ``grads`` (gradients that are not None).
    """
    torch._dynamo.reset()
    eager_module = copy.deepcopy(module) if module is not None else None
    compiled_module = copy.deepcopy(module) if module is not None else None
    backend = CountingInductor()
    compiled_fn = torch.compile(make_fn(compiled_module), backend=backend, dynamic=False)
    expected = _run(make_fn(eager_module), eager_module, inputs, seed)
    actual = _run(compiled_fn, compiled_module, inputs, seed)
    for kind, e, a in zip(("output", "gradient", "buffer"), expected, actual):
        assert len(e) == len(a), f"{kind}s: {len(e)} eager, {len(a)} compiled"
        for i, (x, y) in enumerate(zip(e, a)):
            if x is None or y is None:
                assert x is None and y is None, f"{kind} {i}: None on one side only"
                continue
            # atol is relative to the tensor's largest magnitude (gradients of summed cotangents grow with size)
            scaled_atol = atol * max(1.0, float(x.abs().max())) if x.numel() else atol
            torch.testing.assert_close(y, x, rtol=rtol, atol=scaled_atol, msg=lambda m: f"{kind} {i}: {m}")
    torch._dynamo.reset()
    return {"graphs": backend.graphs, "outputs": len(expected[0]), "grads": sum(g is not None for g in expected[1])}


def graph_breaks(fn: Callable, *inputs) -> Tuple[int, List[str]]:
    """(number of graph breaks, their reasons) of ``fn(*inputs)`` as ``torch._dynamo.explain`` reports."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*inputs)
    torch._dynamo.reset()
    reasons = [f"{r.reason.splitlines()[0]} at {r.user_stack[-1].filename}:{r.user_stack[-1].lineno}"
               if r.user_stack else r.reason.splitlines()[0] for r in explanation.break_reasons]
    return explanation.graph_break_count, reasons


def _relative_error(x: Tensor, reference: Tensor) -> float:
    return float((x.double() - reference).norm() / reference.norm().clamp_min(1e-30))


def compare_compiled_to_float64(module: nn.Module, inputs: Sequence[Tensor], factor: float,
                                floor: float = 1e-6) -> Dict[str, int]:
    """For deep, ill-conditioned networks (BatchNorm in training mode on a few values per channel),
    where fp32 gradients differ from exact ones by percent: the compiled fp32 outputs, gradients and
    buffers must be as close to the float64 eager result as the fp32 eager ones, i.e. their relative
    error (Frobenius norm) at most ``factor`` times the eager fp32 one (plus ``floor``).
    """
    torch._dynamo.reset()
    backend = CountingInductor()
    compiled_module = copy.deepcopy(module)
    eager_module = copy.deepcopy(module)
    eager = _run(eager_module, eager_module, inputs, 0)
    exact_module = copy.deepcopy(module).double()
    exact = _run(exact_module, exact_module, [x.double().requires_grad_(x.requires_grad) for x in inputs], 0)
    compiled = _run(torch.compile(compiled_module, backend=backend, dynamic=False), compiled_module, inputs, 0)
    for kind, e, c, r in zip(("output", "gradient", "buffer"), eager, compiled, exact):
        assert len(e) == len(c) == len(r), f"{kind}s: {len(e)} eager, {len(c)} compiled, {len(r)} float64"
        for i, (x, y, z) in enumerate(zip(e, c, r)):
            if x is None or y is None or z is None:
                assert x is None and y is None and z is None, f"{kind} {i}: None on some side only"
                continue
            if not z.is_floating_point():
                assert torch.equal(y, x), f"{kind} {i}"
                continue
            eager_error, compiled_error = _relative_error(x, z), _relative_error(y, z)
            assert compiled_error <= factor * eager_error + floor, \
                f"{kind} {i}: relative error to float64 {compiled_error:.3g} compiled, {eager_error:.3g} eager"
    torch._dynamo.reset()
    return {"graphs": backend.graphs, "outputs": len(eager[0]), "grads": sum(g is not None for g in eager[1])}
