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
