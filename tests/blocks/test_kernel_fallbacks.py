"""Where Triton cannot build or launch a kernel on a GPU, Med-DisSeg goes on with PyTorch's forms (one warning
naming the error) instead of failing a run; errors that are not Triton's still raise. The failures are
simulated on the CPU: a stand-in for a Triton error replaces the kernel launch."""
import pytest
import torch

from nnunetv2_meddisseg import environment
from nnunetv2_meddisseg.blocks import activation, cdfa, device_forms, telu_kernels
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation


class CompilationError(Exception):
    """Stands in for ``triton.compiler.errors.CompilationError``."""


CompilationError.__module__ = "triton.compiler.errors"


def _failing_launch(*args, **kwargs):
    raise CompilationError("at 12:8: unsupported instruction on this architecture")


@pytest.fixture
def reset_failures():
    yield
    device_forms._fused_failure = None
    telu_kernels._failure = None


class _FailingKernel:
    def __getitem__(self, grid):
        return _failing_launch


def test_telu_falls_back_to_pytorch_once_with_a_warning(monkeypatch, reset_failures):
    pytest.importorskip("triton")
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", True)  # makes the CPU tensor eligible for the kernel
    monkeypatch.setattr(telu_kernels, "_telu_kernel", _FailingKernel())
    x = torch.randn(3, 4, 5, 5) * 3
    with pytest.warns(RuntimeWarning, match="TeLU Triton kernel failed.*CompilationError: at 12:8"):
        y = activation.telu(x)
    torch.testing.assert_close(y, activation._telu_forward(x))
    assert not telu_kernels.telu_triton_available(x)  # off for the process: no second warning
    xg = x.clone().requires_grad_()
    activation.telu(xg).sum().backward()
    assert torch.isfinite(xg.grad).all()


def test_other_errors_of_the_telu_launch_still_raise(monkeypatch, reset_failures):
    pytest.importorskip("triton")
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", True)

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise MemoryError("out of memory")
            return launch
    monkeypatch.setattr(telu_kernels, "_telu_kernel", Broken())
    with pytest.raises(MemoryError):
        activation.telu(torch.randn(4, 4))


def test_cdfa_falls_back_to_the_shifted_form_with_a_warning(monkeypatch, reset_failures):
    torch.manual_seed(0)
    block = ContrastDrivenAggregation(16, dim=8, num_heads=2).eval()
    x, fg, bg = torch.randn(2, 16, 6, 7), torch.randn(2, 8, 6, 7), torch.randn(2, 8, 6, 7)
    with torch.no_grad():
        expected = block(x, fg, bg)  # the CPU runs the shifted form
    monkeypatch.setattr(cdfa, "implementation_form",
                        lambda t, form=None: "shifted" if device_forms._fused_failure else "fused")
    monkeypatch.setattr(cdfa, "fused_cdfa_available", lambda t: True)
    monkeypatch.setattr(ContrastDrivenAggregation, "window_attention_fused", _failing_launch)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="fused CDFA kernels failed.*CompilationError"):
        out = block(x, fg, bg)
    torch.testing.assert_close(out, expected)
    assert device_forms._fused_failure is not None
    monkeypatch.setattr(cdfa, "implementation_form", device_forms.implementation_form)
    block.form = "fused"
    with pytest.raises(CompilationError):  # a block whose form is set never falls back
        block(x, fg, bg)
