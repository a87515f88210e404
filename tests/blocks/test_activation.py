import math

import pytest
import torch
from reference_impls import previous_telu, reference_telu
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TELU_EXP_CLAMP, TeLU, get_activation, telu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LARGE = [-1e4, -1e3, -100.0, -20.0, -11.0, -5.0, -1.0, 0.0, 1.0, 3.0, 5.0, 10.0, 11.0, 12.0, 20.0, 100.0, 1e3, 1e4]


def _reference(x: float) -> float:
    # float64 reference of x * tanh(exp(x)) (math.exp overflows above ~709, where tanh(.) is 1)
    e = math.exp(x) if x < 700 else math.inf
    return x * math.tanh(e)


def _reference_grad(x: float) -> float:
    # d/dx x tanh(e^x) = tanh(e^x) + x e^x sech^2(e^x)
    if x > 5:  # x e^x sech^2(e^x) < 1e-120 there
        return 1.0
    e = math.exp(x)
    return math.tanh(e) + x * e / math.cosh(e) ** 2


def test_values_match_float64_reference():
    xs = torch.linspace(-30, 30, 601, dtype=torch.float64).tolist() + LARGE
    x = torch.tensor(xs, dtype=torch.float32)
    expected = torch.tensor([_reference(v) for v in xs], dtype=torch.float32)
    torch.testing.assert_close(telu(x), expected, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(TeLU()(x), expected, rtol=1e-6, atol=1e-7)


def test_known_values():
    # TeLU(0) = 0, TeLU(1) = tanh(e), large x -> identity, very negative x -> 0
    x = torch.tensor([0.0, 1.0, 50.0, -50.0], dtype=torch.float64)
    expected = torch.tensor([0.0, math.tanh(math.e), 50.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(telu(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_finite_and_close_in_low_precision(dtype):
    x = torch.tensor(LARGE, dtype=dtype)
    y = telu(x)
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    expected = torch.tensor([_reference(v) for v in x.double().tolist()], dtype=torch.float64)
    tol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_finite_for_large_inputs(dtype):
    x = torch.tensor(LARGE, dtype=dtype, requires_grad=True)
    telu(x).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert torch.isfinite(x.grad).all(), x.grad
    expected = torch.tensor([_reference_grad(v) for v in x.detach().double().tolist()], dtype=torch.float64)
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(x.grad.double(), expected, rtol=tol, atol=tol)


def test_gradient_matches_float64_autograd_on_moderate_range():
    x64 = torch.linspace(-8, 8, 161, dtype=torch.float64, requires_grad=True)
    (x64 * torch.tanh(torch.exp(x64))).sum().backward()
    x32 = x64.detach().float().requires_grad_()
    telu(x32).sum().backward()
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_get_activation():
    assert get_activation("telu") is TeLU
    assert get_activation("relu") is nn.ReLU
    assert get_activation("TeLU") is TeLU
    with pytest.raises(ValueError, match="gelu"):
        get_activation("gelu")


# --- the current implementation (no clamp in the value, hand-written backward) against the first one

SPECIAL = [-math.inf, -1e30, -90.0, -5.0, -1e-3, 0.0, 1e-3, 2.0, 3.7, 9.999, TELU_EXP_CLAMP, 10.001, 11.0, 50.0, 88.0,
           89.0, 700.0, 1e30, math.inf]


@pytest.mark.parametrize("dtype", DTYPES + [torch.float64])
def test_values_identical_to_first_implementation(dtype):
    torch.manual_seed(0)
    x = torch.cat([torch.randn(1000) * 6, torch.tensor(SPECIAL), torch.tensor([math.nan])]).to(dtype)
    # bf16 on the CPU is computed in fp32 and rounded once (faster there, and more exact)
    expected = reference_telu(x.float()).to(dtype) if dtype == torch.bfloat16 else reference_telu(x)
    torch.testing.assert_close(telu(x), expected, rtol=0, atol=0, equal_nan=True)
    with torch.no_grad():
        torch.testing.assert_close(TeLU()(x), expected, rtol=0, atol=0, equal_nan=True)


def test_bf16_on_cpu_closer_to_float64_than_bf16_arithmetic():
    torch.manual_seed(0)
    x = (torch.randn(20000) * 3).bfloat16()
    exact = reference_telu(x.double())
    ours = (telu(x).double() - exact).abs()
    in_bf16 = (reference_telu(x).double() - exact).abs()
    assert telu(x).dtype == torch.bfloat16
    assert ours.max() <= in_bf16.max() and ours.mean() < in_bf16.mean()


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_gradient_equals_first_implementation(dtype, tol):
    torch.manual_seed(0)
    base = torch.cat([torch.randn(2000) * 6, torch.tensor([v for v in SPECIAL if math.isfinite(v)])]).to(dtype)
    upstream = torch.randn_like(base)
    grads = []
    for fn in (telu, reference_telu):
        x = base.clone().requires_grad_()
        y = fn(x)
        (y * upstream).sum().backward()
        grads.append(x.grad)
        assert y.requires_grad
    torch.testing.assert_close(grads[0], grads[1], rtol=tol, atol=tol)


def test_gradcheck():
    x = (torch.randn(64, dtype=torch.float64) * 3).requires_grad_()
    assert torch.autograd.gradcheck(telu, (x,))


def test_saves_one_tensor_of_the_input_size_for_backward():
    # autograd would keep x, exp(x) and tanh(exp(x)): the hand-written backward keeps the slope alone
    saved = []
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        telu(x * 1.0)
    assert sum(saved) == x.numel()
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        reference_telu(x * 1.0)
    assert sum(saved) >= 3 * x.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_training_values_equal_inference_values(dtype):
    # the training forward takes the exponent of x clamped at 4: the same values, bit for bit
    x = torch.cat([torch.linspace(-30, 30, 601), torch.tensor([3.99, 4.0, 4.01, 11.5, 60000.0])]).to(dtype)
    with torch.no_grad():
        plain = telu(x)
    trained = telu(x.clone().requires_grad_())
    assert torch.equal(trained.detach(), plain)


def test_input_unchanged_and_works_in_inference_mode():
    x = torch.randn(100)
    before = x.clone()
    with torch.inference_mode():
        y = telu(x)
    assert torch.equal(x, before)
    torch.testing.assert_close(y, reference_telu(before), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_large_inputs_finite_values_and_gradients(dtype):
    # under CPU autocast a convolution hands TeLU its output in bf16 / fp16 (fp16: where this torch's
    # CPU autocast supports it); here an identity 1x1 convolution, so the expected values are known exactly
    conv = nn.Conv2d(1, 1, 1, bias=False)
    nn.init.ones_(conv.weight)
    x = torch.tensor(LARGE).view(1, 1, 1, -1).requires_grad_()
    try:
        with torch.autocast("cpu", dtype=dtype):
            z = conv(x)
            y = TeLU()(z)
    except RuntimeError as e:
        pytest.skip(f"CPU autocast does not support {dtype}: {e}")
    if z.dtype != dtype:
        pytest.skip(f"CPU autocast does not support {dtype} (the convolution ran in {z.dtype})")
    assert y.dtype == dtype and torch.isfinite(y).all()
    values = [_reference(v) for v in z.detach().double().flatten().tolist()]
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(y.double().flatten(), torch.tensor(values, dtype=torch.float64), rtol=tol, atol=tol)
    y.float().sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(conv.weight.grad).all()
    grads = [_reference_grad(v) for v in z.detach().double().flatten().tolist()]
    torch.testing.assert_close(x.grad.double().flatten(), torch.tensor(grads, dtype=torch.float64),
                               rtol=5 * tol, atol=5 * tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_gradient_equals_previous_backward(dtype):
    # the shorter backward (no mask: 1 - tanh^2 is exactly 0 above the clamp) against the one it replaced,
    # over the whole range incl. the clamp, and where x e^x would overflow fp16
    x = torch.cat([torch.linspace(-30, 30, 2001), torch.tensor([9.99, 10.0, 10.01, 11.5, 200.0, -200.0])]).to(dtype)
    grads = []
    for fn in (telu, previous_telu):
        xi = x.clone().requires_grad_()
        fn(xi).backward(torch.linspace(-2, 2, x.numel()).to(dtype))
        grads.append(xi.grad)
    assert torch.isfinite(grads[0]).all()
    tol = {torch.float64: 1e-12, torch.float32: 1e-6}.get(dtype, 1e-2)
    torch.testing.assert_close(grads[0], grads[1], rtol=tol, atol=tol)
    assert torch.equal(grads[0][x > 4], grads[1][x > 4])  # tanh rounds to 1 there: both exactly the incoming grad
