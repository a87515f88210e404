"""The TeLU Triton kernel (``blocks.telu_kernels``) against float64 TeLU and its slope, run by Triton's
interpreter on the CPU (``TRITON_INTERPRET=1``, in a subprocess: the variable must be set before Triton
compiles the kernel); on CUDA the same kernel is compiled for the GPU."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="Triton is not installed (PyTorch's CUDA build ships it)")

CHECK = textwrap.dedent("""
    import torch
    from nnunetv2_meddisseg.blocks.activation import TeLU, _telu_and_slope, telu
    from nnunetv2_meddisseg.blocks.telu_kernels import telu_triton, telu_triton_available

    def relative(a, b):
        return float((a.double() - b).norm() / b.norm())

    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))  # fresh inputs every run
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        for layout in ("nchw", "channels_last"):
            x = (torch.randn(3, 6, 5, 7, generator=g) * 5).to(dtype)
            # far left, 0, the clamp, past fp16's exp
            x[0, 0, 0, :4] = torch.tensor([-30.0, 0.0, 4.0, 11.0], dtype=dtype)
            if layout == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last)
            assert telu_triton_available(x)
            y, slope = telu_triton(x, with_slope=True)
            assert y.dtype == dtype and y.stride() == x.stride() and slope.stride() == x.stride()
            assert torch.isfinite(y).all() and torch.isfinite(slope).all()  # every element written, none NaN
            ref_y, ref_slope = _telu_and_slope(x.double())
            assert relative(y, ref_y) < tolerance, (dtype, layout, relative(y, ref_y))
            assert relative(slope, ref_slope) < tolerance, (dtype, layout, relative(slope, ref_slope))
            assert torch.equal(telu_triton(x)[0], y) and telu_triton(x)[1] is None
    # through the module: values and the gradient of a random upstream gradient
    x = torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float32) * 4
    x64 = x.double().requires_grad_()
    xk = x.clone().requires_grad_()
    upstream = torch.randn(x.shape, generator=g)
    out = TeLU()(xk)
    (grad,) = torch.autograd.grad(out, xk, upstream)
    ref = x64 * torch.tanh(torch.exp(x64))
    (ref_grad,) = torch.autograd.grad(ref, x64, upstream.double())
    assert relative(out.detach(), ref.detach()) < 1e-6 and relative(grad, ref_grad) < 1e-6
    with torch.no_grad():
        assert relative(telu(x), ref.detach()) < 1e-6
    print("telu kernel checks passed")
""")


def test_telu_kernel_matches_float64_telu_and_slope():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "telu kernel checks passed" in done.stdout


def test_the_kernel_is_not_used_on_the_cpu_without_the_interpreter(monkeypatch):
    import torch

    from nnunetv2_meddisseg import environment
    from nnunetv2_meddisseg.blocks.telu_kernels import telu_triton_available

    monkeypatch.setattr(environment, "TRITON_INTERPRETED", False)
    assert not telu_triton_available(torch.randn(2, 3))
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", True)
    assert telu_triton_available(torch.randn(2, 3))
    assert not telu_triton_available(torch.randn(4, 6)[:, ::2])  # not dense: PyTorch's form
    assert not telu_triton_available(torch.randn(2, 3, dtype=torch.float64))
