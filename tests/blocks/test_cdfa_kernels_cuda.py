"""The fused kernels on a CUDA GPU against their reference forms (``blocks.kernel_checks``, the checks
``benchmarks/gpu.py`` also runs): the fused CDFA ops' values and gradients against the float64 shifted form in
fp32 / bf16 / fp16, NCHW and channels_last, the whole ``ContrastDrivenAggregation`` block in the fused form
against its shifted form (eager and compiled), the TeLU kernel against float64 TeLU and
``instance_norm_channels_last`` against torch's instance norm. The forms' times are measured by
``benchmarks/gpu.py``."""
import pytest
import torch

from nnunetv2_meddisseg.blocks import kernel_checks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def device():
    device = torch.device("cuda")
    why = kernel_checks.unavailable("cdfa", device) or kernel_checks.unavailable("telu", device)
    if why:
        pytest.skip(why)
    return device


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cdfa_ops_match_the_float64_shifted_form(device, dtype, channels_last):
    errors = kernel_checks.check_cdfa_ops(device, dtype, channels_last)
    assert max(errors.values()) < kernel_checks.TOLERANCE[dtype], errors


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_block_fused_matches_shifted(device, compiled):
    errors = kernel_checks.check_cdfa_block(device, compiled)
    assert max(errors.values()) < 1e-3, errors


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_telu_kernel_matches_float64_telu(device, dtype, channels_last):
    errors = kernel_checks.check_telu(device, dtype, channels_last)
    assert max(errors.values()) < kernel_checks.TOLERANCE[dtype], errors


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_instance_norm_channels_last_matches_torch(device, dtype):
    errors = kernel_checks.check_instance_norm(device, dtype)
    assert max(errors.values()) < kernel_checks.TOLERANCE[dtype], errors
