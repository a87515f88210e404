import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nnunetv2_meddisseg.blocks.norm import UncountedBatchNorm2d


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _pair(momentum):
    torch.manual_seed(0)
    ours, theirs = UncountedBatchNorm2d(4, momentum=momentum).double(), nn.BatchNorm2d(4, momentum=momentum).double()
    with torch.no_grad():
        for layer in (ours, theirs):
            layer.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
            layer.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    return ours, theirs


@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_matches_torch(momentum):
    ours, theirs = _pair(momentum)
    for step in range(3):
        x = torch.randn(3, 4, 5, 6, dtype=torch.float64) * (step + 1) + step
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        torch.testing.assert_close(ya, yb)
        (ya * torch.arange(ya.numel(), dtype=ya.dtype).view_as(ya)).sum().backward()
        (yb * torch.arange(yb.numel(), dtype=yb.dtype).view_as(yb)).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    # the count advances only where it is read (the cumulative average of momentum None)
    assert int(ours.num_batches_tracked) == (3 if momentum is None else 0)
    ours.eval(), theirs.eval()
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(ours(x), theirs(x))


def test_one_operation_fewer_per_training_forward():
    ours, theirs = _pair(0.1)
    x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
    counts = []
    for layer in (ours, theirs):
        with _Ops() as ops:
            layer(x)
        counts.append(ops.names)
    assert "add_" in counts[1] and "add_" not in counts[0]
    assert len(counts[0]) == len(counts[1]) - 1


def test_state_dicts_load_both_ways():
    ours, theirs = _pair(0.1)
    theirs.train()
    theirs(torch.randn(2, 4, 3, 3, dtype=torch.float64))
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert int(ours.num_batches_tracked) == 1
    theirs.load_state_dict(ours.state_dict())


def test_instance_norm_matches_torch():
    from nnunetv2_meddisseg.blocks.norm import SingleKernelInstanceNorm2d as InstanceNorm2d

    torch.manual_seed(0)
    ours, theirs = InstanceNorm2d(4, eps=1e-5).double(), nn.InstanceNorm2d(4, eps=1e-5, affine=True).double()
    with torch.no_grad():
        for layer in (ours, theirs):
            layer.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
            layer.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for training in (True, False):
        ours.train(training), theirs.train(training)
        x = torch.randn(3, 4, 5, 6, dtype=torch.float64) * 3 + 1
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        torch.testing.assert_close(ya, yb)
        weights = torch.arange(ya.numel(), dtype=ya.dtype).view_as(ya)
        (ya * weights).sum().backward(), (yb * weights).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad)
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
        torch.testing.assert_close(ours.bias.grad, theirs.bias.grad)
        ours.zero_grad(), theirs.zero_grad()
    # each image by its own statistics: a sample's output does not depend on the rest of the batch
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    torch.testing.assert_close(ours(x)[:1], ours(x[:1]))
    with _Ops() as ops:
        ours(x)
    assert [n for n in ops.names if n != "detach"] == ["native_group_norm"]
    with pytest.raises(ValueError, match="track_running_stats"):
        InstanceNorm2d(4, track_running_stats=True)


def test_the_names_plans_files_store_find_the_same_classes():
    """Plans store class paths as strings; nnU-Net resolves them with pydoc.locate."""
    import pydoc

    from nnunetv2_meddisseg.blocks.norm import SingleKernelInstanceNorm2d, UncountedBatchNorm2d

    for stored, cls in (("UncountedBatchNorm2d", UncountedBatchNorm2d),
                        ("SingleKernelInstanceNorm2d", SingleKernelInstanceNorm2d)):
        assert pydoc.locate(f"nnunetv2_meddisseg.blocks.norm.{stored}") is cls
    # each class has one name: torch's class names find nothing here
    assert pydoc.locate("nnunetv2_meddisseg.blocks.norm.BatchNorm2d") is None
    assert pydoc.locate("nnunetv2_meddisseg.blocks.norm.InstanceNorm2d") is None
    assert UncountedBatchNorm2d is not nn.BatchNorm2d and SingleKernelInstanceNorm2d is not nn.InstanceNorm2d


@pytest.mark.parametrize("affine", [True, False])
def test_channels_last_instance_norm_matches_group_norm_and_keeps_the_layout(affine):
    from nnunetv2_meddisseg.blocks.norm import instance_norm_channels_last

    g = torch.Generator().manual_seed(int(torch.randint(0, 2 ** 31, (1,))))
    x = (torch.randn(3, 6, 7, 5, generator=g) * 4 + 2).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(6, generator=g) if affine else None
    bias = torch.randn(6, generator=g) if affine else None
    xs = [x.clone().double().requires_grad_(), x.clone().requires_grad_()]
    params = [[p.clone().double().requires_grad_() if p is not None else None for p in (weight, bias)],
              [p.clone().requires_grad_() if p is not None else None for p in (weight, bias)]]
    upstream = torch.randn(x.shape, generator=g)
    reference = torch.nn.functional.group_norm(xs[0], 6, *params[0], eps=1e-5)  # float64, NCHW
    out = instance_norm_channels_last(xs[1], *params[1], eps=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-5)
    wanted = [xs[0]] + [p for p in params[0] if p is not None]
    got = [xs[1]] + [p for p in params[1] if p is not None]
    for a, b in zip(torch.autograd.grad(reference, wanted, upstream.double()), torch.autograd.grad(out, got, upstream)):
        torch.testing.assert_close(b.double(), a, rtol=1e-4, atol=1e-4)
    low = instance_norm_channels_last(x.bfloat16(), weight, bias, 1e-5)
    assert low.dtype == torch.bfloat16 and low.is_contiguous(memory_format=torch.channels_last)
    assert float((low.double() - reference.detach()).norm() / reference.detach().norm()) < 1e-2
