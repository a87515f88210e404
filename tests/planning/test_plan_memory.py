"""The plan command's batch from a training memory measured on a CUDA GPU (the measurement stubbed here:
no GPU in the test environment), and the record of how each plan's batch was chosen."""
import math

import pytest
import torch
from test_plan_meddisseg import _source_plans

from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.planning import plan_meddisseg as plan_module
from nnunetv2_meddisseg.planning.memory import GIB, MemoryLine, batch_size_for_memory
from nnunetv2_meddisseg.planning.plan_meddisseg import build_meddisseg_plans


def _line(per_sample_gib: float, static_gib: float) -> MemoryLine:
    batches = (2, 4)
    peaks = tuple(int((static_gib + per_sample_gib * b) * GIB) for b in batches)
    return MemoryLine(per_sample_gib * GIB, static_gib * GIB, "NVIDIA Test GPU", "fp16", batches, peaks)


@pytest.mark.parametrize("per_sample, static, target", [(1.0, 2.0, 8.0), (1.37, 0.9, 8.0), (0.31, 1.2, 24.0),
                                                        (3.0, 2.5, 8.0)])
def test_batch_is_the_largest_that_fits_the_target(per_sample, static, target):
    line = _line(per_sample, static)
    batch = batch_size_for_memory(line, target)
    fitting = [b for b in range(1, 200) if static + per_sample * b <= target + 1e-9]  # brute force
    assert batch == max(fitting + [2])  # at least 2 samples: the dispersive loss needs pairs
    if fitting and max(fitting) >= 2:
        assert line.peak_bytes(batch) <= target * GIB


def test_plans_use_the_measured_line_and_record_it():
    calls = []

    def measured(patch_size, architecture):
        calls.append((tuple(patch_size), architecture["arch_kwargs"]["added_norm_op"]))
        return _line(1.0, 2.0)

    plans = build_meddisseg_plans(_source_plans((256, 256)), memory_target_gb=8.0, memory_line=measured)
    config = plans["configurations"]["2d"]
    from nnunetv2_meddisseg.plans_architecture import ADDED_NORMS, DEFAULT_ADDED_NORM

    assert config["batch_size"] == 6 and calls == [((256, 256), ADDED_NORMS[DEFAULT_ADDED_NORM][0])]
    assert "measured on NVIDIA Test GPU" in config["batch_size_source"]
    assert "8.00 GiB expected at batch 6" in config["batch_size_source"]


def test_plans_record_the_estimate_and_an_explicit_batch():
    estimated = build_meddisseg_plans(_source_plans((256, 256)))["configurations"]["2d"]
    assert "estimated from a CPU measurement" in estimated["batch_size_source"]
    explicit = build_meddisseg_plans(_source_plans((256, 256)), batch_size=3)["configurations"]["2d"]
    assert explicit["batch_size"] == 3 and explicit["batch_size_source"] == "--batch_size"


def test_memory_from_gpu_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"--memory_from gpu: no CUDA GPU is available here.*--memory_from estimate"):
        plan_module._memory_measurement("gpu")
    assert plan_module._memory_measurement("auto") is None  # auto falls back to the estimate
    assert plan_module._memory_measurement("estimate") is None


def test_memory_from_auto_measures_where_cuda_is_available(monkeypatch):
    from nnunetv2_meddisseg.planning import memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory, "measure_training_memory", lambda patch_size, architecture: _line(0.5, 1.0))
    measure = plan_module._memory_measurement("auto")
    assert measure is not None and measure((64, 64), {}).per_sample_bytes == 0.5 * GIB
    assert math.isclose(_line(0.5, 1.0).peak_bytes(4), 3.0 * GIB)
