"""Checks of the fused CDFA ops (``blocks.cdfa_kernels``) on CPU tensors through Triton's interpreter, run by
``test_cdfa_kernels.py`` in a subprocess: ``TRITON_INTERPRET=1`` must be set before Triton is first imported
in a process, which a pytest session shared with other Triton users cannot do.

``python cdfa_kernel_checks.py RESULTS.json NAME...`` runs the named checks (of :data:`CHECKS`) with every op
output allocated NaN-filled (an element a kernel leaves unwritten shows as NaN) and writes
``{name: "" if passed else the traceback}``. Inputs are random (seeded per check), compared in values and
gradients (random upstream gradients) against the float64 shifted form (``window_displacement_weights`` of
the softmaxed logits, ``displacement_sum``) and the unfold reference, in fp32 / fp16 / bf16, NCHW and
channels_last; plus the custom ops under ``torch.compile(fullgraph=True)``, their fake implementations, and the
whole block in the fused form against its shifted form.
"""
import functools
import json
import os
import sys
import traceback
from typing import Callable, Dict

import torch
from reference_impls import reference_window_attention, reference_window_weights

from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation
from nnunetv2_meddisseg.blocks.cdfa_kernels import offset_aggregate, window_offset_weights
from nnunetv2_meddisseg.blocks.kernel_checks import poisoned_outputs, reference_offset_weights
from nnunetv2_meddisseg.blocks.kernel_checks import reference_aggregate as _reference_aggregate
from nnunetv2_meddisseg.blocks.kernel_checks import relative_error as _rel

SCALE = 0.5 ** 0.5  # any positive scale


def _randn(shape, dtype, generator, channels_last=False):
    t = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def _float64(t):
    return t.detach().to(torch.float64, memory_format=torch.contiguous_format).requires_grad_()


def _reference_offset_weights(logits, heads, k):
    return reference_offset_weights(logits, SCALE, heads, k)


TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# (dtype, channels_last, (H, W)); (2, 5): H smaller than the window
CASES = [(torch.float32, False, (5, 9)), (torch.float32, True, (5, 9)), (torch.float32, True, (7, 6)),
         (torch.float32, False, (2, 5)), (torch.float16, True, (6, 7)), (torch.bfloat16, False, (5, 9))]


def check_window_offset_weights(dtype, channels_last, size):
    gen = torch.Generator().manual_seed(1)
    heads, k = 2, 3
    logits = _randn((2, heads * k ** 4, *size), dtype, gen, channels_last).mul_(2).requires_grad_()
    out = window_offset_weights(logits, SCALE, heads, k)
    reference_logits = _float64(logits)
    ref = _reference_offset_weights(reference_logits, heads, k)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert _rel(out, ref) < TOLERANCE[dtype]
    upstream = _randn(out.shape, torch.float32, gen)
    (grad,) = torch.autograd.grad(out, logits, upstream)
    (ref_grad,) = torch.autograd.grad(ref, reference_logits, upstream.double())
    assert grad.dtype == dtype and grad.stride() == logits.stride()
    assert _rel(grad, ref_grad) < TOLERANCE[dtype]


def check_offset_aggregate(dtype, channels_last, size):
    gen = torch.Generator().manual_seed(2)
    b, heads, head_dim = 2, 2, 4
    values = _randn((b, heads * head_dim, *size), dtype, gen, channels_last).requires_grad_()
    weights = _randn((b, heads, 25, *size), torch.float32, gen)
    if channels_last:  # D with the offsets of a pixel contiguous
        weights = weights.permute(0, 3, 4, 1, 2).contiguous().permute(0, 3, 4, 1, 2)
    weights.requires_grad_()
    out = offset_aggregate(values, weights)
    reference_values, reference_weights = _float64(values), _float64(weights)
    ref = _reference_aggregate(reference_values, reference_weights)
    assert out.dtype == dtype and out.shape == values.shape and out.stride() == values.stride()
    assert _rel(out, ref) < TOLERANCE[dtype]
    upstream = _randn(out.shape, dtype, gen)
    grad_values, grad_weights = torch.autograd.grad(out, (values, weights), upstream)
    ref_values, ref_weights = torch.autograd.grad(ref, (reference_values, reference_weights), upstream.double())
    assert grad_values.dtype == dtype and grad_values.stride() == values.stride()
    assert grad_weights.dtype == torch.float32
    assert _rel(grad_values, ref_values) < TOLERANCE[dtype]
    assert _rel(grad_weights, ref_weights) < TOLERANCE[dtype]


def check_kernel_size_5_and_heads_wider_than_a_channel_block():
    # k = 5: 81 offsets; head_dim 80 > the 64 channels a program handles (channel blocks, looped grad_D)
    gen = torch.Generator().manual_seed(3)
    heads, k, head_dim, size = 1, 5, 80, (4, 6)
    logits = _randn((1, heads * k ** 4, *size), torch.float32, gen).requires_grad_()
    values = _randn((1, heads * head_dim, *size), torch.float32, gen, channels_last=True).requires_grad_()
    out = offset_aggregate(values, window_offset_weights(logits, SCALE, heads, k))
    inputs64 = [_float64(logits), _float64(values)]
    ref = _reference_aggregate(inputs64[1], _reference_offset_weights(inputs64[0], heads, k))
    assert _rel(out, ref) < 1e-5
    upstream = _randn(out.shape, torch.float32, gen)
    grads = torch.autograd.grad(out, (logits, values), upstream)
    ref_grads = torch.autograd.grad(ref, inputs64, upstream.double())
    for grad, ref_grad in zip(grads, ref_grads):
        assert _rel(grad, ref_grad) < 1e-5


def check_fused_attention_equals_unfold_reference():
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    m = ContrastDrivenAggregation(4, dim=8, num_heads=2)
    with torch.no_grad():
        m.attn_fg.weight.mul_(10)  # peaked attention: a misplaced window entry would show
    m64 = ContrastDrivenAggregation(4, dim=8, num_heads=2).double()
    m64.load_state_dict(m.state_dict())
    values = _randn((1, 8, 6, 7), torch.float32, gen).requires_grad_()
    guidance = _randn((1, 8, 6, 7), torch.float32, gen).requires_grad_()
    out = m.window_attention_fused(values, guidance, m.attn_fg)
    inputs64 = [_float64(values), _float64(guidance)]
    ref = reference_window_attention(m64, inputs64[0], reference_window_weights(m64, inputs64[1], m64.attn_fg))
    assert _rel(out, ref) < 1e-5
    upstream = _randn(out.shape, torch.float32, gen)
    grads = torch.autograd.grad(out, (values, guidance, m.attn_fg.weight), upstream)
    ref_grads = torch.autograd.grad(ref, (*inputs64, m64.attn_fg.weight), upstream.double())
    for grad, ref_grad in zip(grads, ref_grads):
        assert _rel(grad, ref_grad) < 1e-5


def check_compiled_fullgraph_equals_eager():
    gen = torch.Generator().manual_seed(5)
    heads, k = 2, 3

    def attention(logits, values):
        return offset_aggregate(values, window_offset_weights(logits, SCALE, heads, k)) * 2

    logits = _randn((1, heads * k ** 4, 5, 6), torch.float32, gen).requires_grad_()
    values = _randn((1, heads * 4, 5, 6), torch.float32, gen, channels_last=True).requires_grad_()
    upstream = _randn(values.shape, torch.float32, gen)
    torch._dynamo.reset()
    compiled = torch.compile(attention, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    results = []
    for fn in (attention, compiled):
        out = fn(logits, values)
        results.append([out, *torch.autograd.grad(out, (logits, values), upstream)])
    for ours, ref in zip(results[1], results[0]):
        assert _rel(ours, ref) < 1e-6


def check_fake_implementations_match_the_kernels():
    """Shapes, dtypes and strides of the registered fake (meta) implementations equal the real outputs'."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gen = torch.Generator().manual_seed(6)
    logits = _randn((1, 2 * 81, 3, 4), torch.bfloat16, gen, channels_last=True)
    values = _randn((1, 2 * 3, 3, 4), torch.float16, gen, channels_last=True)
    weights = _randn((1, 2, 25, 3, 4), torch.float32, gen)
    calls = [(torch.ops.meddisseg.window_offset_weights, (logits, SCALE, 2, 3)),
             (torch.ops.meddisseg.window_offset_weights_backward, (weights, logits, SCALE, 2, 3)),
             (torch.ops.meddisseg.offset_aggregate, (values, weights)),
             (torch.ops.meddisseg.offset_aggregate_backward, (values, values, weights))]
    for op, args in calls:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,)):
            assert (r.shape, r.dtype, r.stride()) == (f.shape, f.dtype, f.stride()), op


def check_block_fused_form_equals_shifted_form():
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    m = ContrastDrivenAggregation(4, dim=8, num_heads=2).train()
    x, fg, bg = (_randn((1, c, 6, 5), torch.float32, gen) for c in (4, 8, 8))
    upstream = _randn((1, 8, 6, 5), torch.float32, gen)
    results = []
    for form in ("shifted", "fused"):
        inputs = [t.clone().requires_grad_() for t in (x, fg, bg)]
        m.form = form
        out = m(*inputs)
        grads = torch.autograd.grad(out, [*inputs, *m.parameters()], upstream)
        results.append([out, *grads])
    for name, ours, ref in zip(["out", "x", "fg", "bg"] + [n for n, _ in m.named_parameters()], *results[::-1]):
        assert _rel(ours, ref) < 1e-4, name


def _case_name(dtype, channels_last, size) -> str:
    return f"{str(dtype)[6:]}-{'cl' if channels_last else 'nchw'}-{size[0]}x{size[1]}"


#: name -> check (no arguments)
CHECKS: Dict[str, Callable[[], None]] = {}
for _case in CASES:
    CHECKS[f"window_offset_weights-{_case_name(*_case)}"] = functools.partial(check_window_offset_weights, *_case)
    CHECKS[f"offset_aggregate-{_case_name(*_case)}"] = functools.partial(check_offset_aggregate, *_case)
for _check in (check_kernel_size_5_and_heads_wider_than_a_channel_block, check_fused_attention_equals_unfold_reference,
               check_compiled_fullgraph_equals_eager, check_fake_implementations_match_the_kernels,
               check_block_fused_form_equals_shifted_form):
    CHECKS[_check.__name__[len("check_"):]] = _check


def main(argv=None) -> int:
    results_path, *names = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1 (before Triton is imported) to run these checks on the CPU")
    results = {}
    with poisoned_outputs():
        for name in names:
            try:
                CHECKS[name]()
                results[name] = ""
            except Exception:  # reported per check
                results[name] = traceback.format_exc()
    with open(results_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
