"""``blocks.kernel_checks`` on the CPU: a correct instance norm passes, a wrong one fails, and kernels that cannot
run here are reported as skipped with the reason (their checks run under Triton's interpreter in
``test_cdfa_kernels.py`` / ``test_telu_kernels.py``, and on CUDA in ``test_cdfa_kernels_cuda.py``)."""
import torch

from nnunetv2_meddisseg import environment
from nnunetv2_meddisseg.blocks import kernel_checks, norm


def test_instance_norm_check_passes_and_catches_a_wrong_normalisation(monkeypatch):
    cpu = torch.device("cpu")
    errors = kernel_checks.check_instance_norm(cpu, torch.float32, (2, 4, 5, 6))
    assert set(errors) == {"out", "grad_x", "grad_weight", "grad_bias"}
    assert max(errors.values()) < kernel_checks.TOLERANCE[torch.float32]

    def biased(x, weight, bias, eps):  # variance with Bessel's correction: a plausible, wrong normalisation
        var, mean = torch.var_mean(x.float(), dim=(2, 3), keepdim=True, correction=1)
        return ((x - mean) / torch.sqrt(var + eps) * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)).to(x.dtype)

    monkeypatch.setattr(norm, "instance_norm_channels_last", biased)
    results = kernel_checks.run_checks(cpu, small=True, compiled=False)
    assert results["instance_norm_channels_last"]["float32"]["passed"] is False


def test_relative_error_refuses_an_unwritten_element():
    ours = torch.ones(3)
    ours[1] = float("nan")
    try:
        kernel_checks.relative_error(ours, torch.ones(3))
    except AssertionError as error:
        assert "not written" in str(error)
    else:
        raise AssertionError("a NaN element passed")


def test_kernels_that_cannot_run_here_are_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", False)
    results = kernel_checks.run_checks(torch.device("cpu"), small=True, compiled=False)
    for kernel in ("cdfa", "telu"):
        assert all("Triton" in r["skipped"] for r in results[kernel].values())
    assert all(r["passed"] for r in results["instance_norm_channels_last"].values())
