"""Checks that a block whose parallel branches run as one grouped block computes what the separate branches did."""
from typing import Callable, Sequence

import torch
from reference_impls import branch_layout, merge_branches, previous_of, split_branches
from torch import Tensor, nn


def randomised(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine norm parameters and running statistics (default ones would hide a wrong mapping)."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data = 1 + 0.3 * torch.randn(m.weight.shape, generator=g)
            m.bias.data = 0.3 * torch.randn(m.bias.shape, generator=g)
            m.running_mean = 0.2 * torch.randn(m.running_mean.shape, generator=g)
            m.running_var = 1 + torch.rand(m.running_var.shape, generator=g)
        elif isinstance(m, nn.Conv2d) and m.bias is not None:
            m.bias.data = 0.3 * torch.randn(m.bias.shape, generator=g)
    return module


def _flat(outputs) -> list:
    if isinstance(outputs, Tensor):
        return [outputs]
    if outputs is None:
        return []
    return [t for o in outputs for t in _flat(o)]


def assert_merged_equals_previous(old: nn.Module, new: nn.Module, inputs: Sequence[Tensor],
                                  call: Callable = lambda m, *x: m(*x)) -> None:
    """Load ``old``'s state dict (the separate-branch layout), merged (:func:`merge_branches`), into ``new``,
    then compare in ``old``'s mode: outputs (rtol 1e-5, atol 1e-5), gradients of a weighted sum of the outputs for
    the inputs (rtol 1e-4, atol 1e-5) and for every parameter mapped back through :func:`branch_layout` (rtol 1e-4,
    atol 1e-4 x the largest magnitude: the merged convolutions sum in another order), the running statistics after
    the call, and the mapping back (``previous_of``) exactly."""
    layout = branch_layout(new)
    new.load_state_dict(merge_branches(old.state_dict(), layout))
    new.train(old.training)
    again = previous_of(new, _like(old))
    for k, v in old.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=0, atol=0)
    x_old = [t.detach().clone().requires_grad_() for t in inputs]
    x_new = [t.detach().clone().requires_grad_() for t in inputs]
    out_old, out_new = _flat(call(old, *x_old)), _flat(call(new, *x_new))
    assert len(out_old) == len(out_new)
    for a, b in zip(out_old, out_new):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(a.shape, generator=g) for a in out_old]
    sum((w * a).sum() for w, a in zip(weights, out_old)).backward()
    sum((w * b).sum() for w, b in zip(weights, out_new)).backward()
    for a, b in zip(x_old, x_new):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
    grads_old = {n: p.grad for n, p in old.state_dict(keep_vars=True).items() if isinstance(p, nn.Parameter)}
    grads_new = split_branches({n: p.grad for n, p in new.named_parameters() if p.grad is not None}, layout)
    assert set(grads_new) == {n for n, g in grads_old.items() if g is not None}
    for n, grad in grads_new.items():
        ref = grads_old[n]
        torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item(),
                                   msg=lambda m, n=n: f"{n}: {m}")
    stats = split_branches(new.state_dict(), layout)
    for k, v in old.state_dict().items():
        torch.testing.assert_close(stats[k], v, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


_LIKE = {}


def _like(old: nn.Module) -> nn.Module:
    """A fresh module of ``old``'s class and construction arguments (registered by :func:`build`)."""
    cls, args, kwargs = _LIKE[id(old)]
    return cls(*args, **kwargs)


def build(cls, *args, **kwargs) -> nn.Module:
    """``cls(*args, **kwargs)``, remembered so that :func:`assert_merged_equals_previous` can build another."""
    module = cls(*args, **kwargs)
    _LIKE[id(module)] = (cls, args, kwargs)
    return module
