import math

import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU, get_activation, telu

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
