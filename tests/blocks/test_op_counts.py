"""The aten operations of Med-DisSeg's training step and inference forward are pinned: a change that adds
kernel launches fails here. On a GPU every aten operation is at least one kernel launch; the counts do not
depend on the input size, so tiny inputs (batch 2, 32x32) are used. The CDFA blocks run their graph form
(whole-tensor operations, the same on every device): the fused form a GPU runs needs Triton."""
from collections import Counter
from typing import Callable, Sequence

import torch
from reference_impls import use_previous_implementations
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.objectives import recipe_stage2_loss

#: counts with the CDFA blocks in the graph form (set on the network), measured on the CPU; each pinned within MARGIN
STAGE2_STEP_OPS = 6256
INFERENCE_OPS = 2183
CDFA_INFERENCE_OPS = 375
MARGIN = 0.02


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched inside it, in total, per operator and per watched module
    (inclusive of its sub-modules, through forward hooks)."""

    def __init__(self, root: nn.Module = None, names: Sequence[str] = ()) -> None:
        super().__init__()
        self.total = 0
        self.by_op: Counter = Counter()
        self.by_module: Counter = Counter()
        self._active = []
        self._handles = []
        for name in names:
            module = root.get_submodule(name)
            self._handles += [module.register_forward_pre_hook(lambda m, a, n=name: self._active.append(n)),
                              module.register_forward_hook(lambda m, a, o, n=name: self._active.remove(n))]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        self.by_op[func.overloadpacket.__name__] += 1
        for name in self._active:
            self.by_module[name] += 1
        return func(*args, **(kwargs or {}))

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        return super().__exit__(*exc)


def count(fn: Callable[[], object], root: nn.Module = None, names: Sequence[str] = ()) -> OpCounter:
    with OpCounter(root, names) as counter:
        fn()
    return counter


def _network() -> nn.Module:
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    torch.manual_seed(0)
    return MedDisSegNet(3, 2)


def _inputs(size=32):
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    target = torch.zeros(2, 1, size, size)
    target[:, :, 4:20, 8:24] = 1
    return x, target


def _pinned(count: int, pinned: int) -> bool:
    return abs(count - pinned) <= MARGIN * pinned


def test_stage2_step_count_is_pinned():
    net = _network().train()
    loss = recipe_stage2_loss(nnUNetTrainerMedDisSeg.recipe)
    x, target = _inputs()

    def step():
        net.zero_grad(set_to_none=True)
        loss(net(x, output="all"), target).backward()

    with implementation_form_of(net, "graph"):
        step()  # lazy initialisations out of the count
        counted = count(step).total
    assert _pinned(counted, STAGE2_STEP_OPS), counted


def test_inference_count_is_pinned_and_far_below_the_previous_implementations():
    net = _network().eval()
    x, _ = _inputs()
    with implementation_form_of(net, "graph"), torch.no_grad():
        counter = count(lambda: net(x), net, ["cdfa.0", "cdfa.3"])
        previous = count(lambda: use_previous_implementations(net)(x)).total
    assert _pinned(counter.total, INFERENCE_OPS), counter.total
    assert counter.by_module["cdfa.0"] == counter.by_module["cdfa.3"] and _pinned(counter.by_module["cdfa.0"],
                                                                                   CDFA_INFERENCE_OPS)
    assert previous > 2.5 * counter.total  # the previous implementations issued 5,914 operations


def test_counter_counts_every_operation():
    a = torch.randn(3, 3)
    counter = count(lambda: (a @ a).relu_().sum())
    assert counter.total == 3 and counter.by_op == {"mm": 1, "relu_": 1, "sum": 1}
