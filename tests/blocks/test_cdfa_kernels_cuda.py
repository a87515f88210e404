"""The fused CDFA window attention (``blocks.cdfa_kernels``, Triton) on a CUDA GPU against the float64 shifted
form (``window_displacement_weights`` of the softmaxed logits, ``displacement_sum``): both ops' values and
gradients in fp32 / bf16 / fp16, NCHW and channels_last (relative error ||ours - ref|| / ||ref||), and the whole
``ContrastDrivenAggregation`` block in the fused form against its shifted form, eager and compiled. The forms'
times are measured by ``benchmarks/gpu.py``."""
import pytest
import torch

from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, displacement_sum, window_displacement_weights
from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available, offset_aggregate, window_offset_weights
from nnunetv2_meddisseg.blocks.device_forms import forced_form

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def device():
    device = torch.device("cuda")
    if not fused_cdfa_available(torch.empty(0, device=device)):
        pytest.skip("the fused CDFA ops are not available here (Triton missing)")
    return device


def _rel(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double()
    return float((ours.detach().double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_ops_match_the_float64_shifted_form(device, dtype, channels_last, heads=4, head_dim=32, size=(37, 41), k=3):
    scale = head_dim ** -0.5
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
    ref = displacement_sum(v64, window_displacement_weights(weights, k))
    upstream = torch.randn(out.shape, device=device, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, (logits, values), upstream)
    ref_grads = torch.autograd.grad(ref, (l64, v64), upstream.double())
    errors = {"out": _rel(out, ref), "grad_logits": _rel(grads[0], ref_grads[0]),
              "grad_values": _rel(grads[1], ref_grads[1])}
    assert max(errors.values()) < 1e-2, errors
    assert out.stride() == values.stride() and grads[0].stride() == logits.stride()  # layout kept


def _block_run(m, inputs, upstream, form, compiled=None):
    inputs = [t.clone().requires_grad_() for t in inputs]
    with forced_form(form):
        out = (compiled or m)(*inputs)
    grads = torch.autograd.grad(out, [*inputs, *m.parameters()], upstream)
    return [out, *grads]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_block_fused_matches_shifted(device, compiled, dim=64, heads=4, size=(24, 20)):
    """Output and every gradient of the block in the fused form against its shifted form (training mode)."""
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(dim, dim, heads).to(device).train()
    inputs = [torch.randn(2, dim, *size, device=device) for _ in range(3)]
    upstream = torch.randn(2, dim, *size, device=device)
    ref = _block_run(m, inputs, upstream, "shifted")
    module = None
    if compiled:
        torch._dynamo.reset()
        module = torch.compile(m, fullgraph=True)
    error = max(_rel(a, b) for a, b in zip(_block_run(m, inputs, upstream, "fused", module), ref))
    assert error < 1e-3
