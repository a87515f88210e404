"""The operation counts of ``benchmarks/op_count.py`` are pinned: a change that adds kernel launches to
Med-DisSeg's training step or inference forward (in the form a GPU runs) fails here. The counts do not
depend on the input size; tiny inputs (batch 2, 32x32)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

#: counts of the few-op form (forced), measured on the CPU; each pinned within MARGIN
STAGE2_STEP_OPS = 3159
INFERENCE_OPS = 938
CDFA_INFERENCE_OPS = 63
MARGIN = 0.02


@pytest.fixture(scope="module")
def op_count():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("op_count", BENCHMARKS / "op_count.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _network(deep_supervision: bool):
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    torch.manual_seed(0)
    return MedDisSegNet(3, 2, deep_supervision=deep_supervision)


def _inputs(size=32):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    target = torch.zeros(2, 1, size, size)
    target[:, :, 4:20, 8:24] = 1
    return x, target


def _pinned(count: int, pinned: int) -> bool:
    return abs(count - pinned) <= MARGIN * pinned


def test_stage2_step_count_is_pinned(op_count):
    from train_step import Stage2Loss

    from nnunetv2_meddisseg.blocks.device_forms import forced_form

    net = _network(True).train()
    loss = Stage2Loss(dispersive=True)
    x, target = _inputs()

    def step():
        net.zero_grad(set_to_none=True)
        loss(net(x), target).backward()

    with forced_form("few_op"):
        step()
        counted = op_count.count(step).total
    assert _pinned(counted, STAGE2_STEP_OPS), counted


def test_inference_count_is_pinned_and_far_below_the_previous_implementations(op_count):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "blocks"))
    from reference_impls import use_previous_implementations

    from nnunetv2_meddisseg.blocks.device_forms import forced_form

    net = _network(False).eval()
    x, _ = _inputs()
    with forced_form("few_op"), torch.no_grad():
        counter = op_count.count(lambda: net(x), net, ["cdfa.0", "cdfa.3"])
        previous = op_count.count(lambda: use_previous_implementations(net)(x)).total
    assert _pinned(counter.total, INFERENCE_OPS), counter.total
    assert counter.by_module["cdfa.0"] == counter.by_module["cdfa.3"] and _pinned(counter.by_module["cdfa.0"],
                                                                                   CDFA_INFERENCE_OPS)
    assert previous > 3 * counter.total  # the previous implementations issued 3,800 operations


def test_counter_counts_every_operation(op_count):
    a = torch.randn(3, 3)
    counter = op_count.count(lambda: (a @ a).relu_().sum())
    assert counter.total == 3 and counter.by_op == {"mm": 1, "relu_": 1, "sum": 1}
