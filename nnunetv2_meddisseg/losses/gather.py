"""The global batch of a data-parallel run, for losses whose samples are each other's negatives.

Under ``torch.distributed`` (nnU-Net's ``-num_gpus N``: one process per GPU, the batch split between
them) each process holds only its share ``H_r`` (B_r, ...) of the batch. A loss over the pairs of a
batch, such as the dispersive loss, computed on ``H_r`` alone sees ``B_r (B_r - 1)`` pairs instead of
``B (B - 1)``, and none at all when ``B_r = 1``. ``gather_batch`` returns the concatenation
``H = [H_0; ...; H_{R-1}]`` (B, ...) on every process, so that ``L(gather_batch(H_r))`` has the value
``L(H)`` of a single process holding the whole batch.

Gradient. Process r's own rows keep their gradient; the other processes' rows enter as constants, and
the gradient that reaches ``H_r`` is multiplied by the world size R: process r back-propagates
``R dL/dH_r``. DDP averages the parameter gradients of the R processes (their sum divided by R), so
the parameters receive ``(1/R) sum_r R dL/dH_r dH_r/dtheta = dL/dtheta``, the gradient of a single
process training on the concatenated batch (as the segmentation loss, a per-process mean, averages
to the mean over the whole batch when the shares are equal). Summed over the processes, the gradients are
``R dL/dtheta``. Without the factor R, DDP's averaging would give ``dL/dtheta / R``: the regulariser
would weaken as GPUs are added.

Why constants and not a gradient-carrying all-gather (``torch.distributed.nn.functional.all_gather``,
whose backward all-reduces the gradient of the whole gathered batch and keeps the process's slice):
every process computes the same ``L`` from the same ``H``, so that all-reduce returns
``sum_s dL/dH_r = R dL/dH_r``, the very gradient given here, at the price of a second collective as
large as the first (B x D values) in every backward. Constants with the factor R give the same
gradients with one all-gather in the forward and no communication in the backward. Valid as long as
every process computes the same function of ``H`` (true for every variant of ``losses.dispersive``).

Cost: each process receives ``(B - B_r) D`` values per call, in the features' dtype (fp16 / bf16
under autocast), plus a small all-gather of the shapes (the shares may differ in size, as nnU-Net's
split of a batch of 5 over 2 GPUs into 3 + 2 does). Every process must call it, in the same order.
"""
from typing import List, Optional

import torch
from torch import Tensor
from torch import distributed as dist

__all__ = ["gather_batch"]

_MAX_DIMS = 8


class _GatherRows(torch.autograd.Function):
    """forward: (B_r, ...) -> (B, ...), the shares of every process in rank order; backward: the
    gradient of this process's rows, multiplied by the world size (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: Tensor, sizes: List[int], rank: int, group: Optional[object]) -> Tensor:
        largest = max(sizes)
        padded = x.contiguous()
        if x.shape[0] < largest:
            padded = torch.cat([padded, padded.new_zeros((largest - x.shape[0],) + tuple(x.shape[1:]))])
        shares = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(shares, padded, group=group)
        shares[rank] = x  # this process's own values, bit for bit
        ctx.rows = (sum(sizes[:rank]), x.shape[0])
        ctx.world_size = len(sizes)
        return torch.cat([share[:size] for share, size in zip(shares, sizes)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        start, size = ctx.rows
        return grad[start:start + size] * ctx.world_size, None, None, None


def gather_batch(x: Tensor, group: Optional[object] = None) -> Tensor:
    """The batch of every process of ``group`` (default: the whole world), concatenated in rank order.

    x: (B_r, ...) this process's share; the shares may differ in B_r, not in the other dimensions.
    Returns (sum_r B_r, ...) in x's dtype and device, whose rows of this process carry x's gradient
    times the world size and whose other rows are constants (module docstring). Without a process group,
    or with a single process, returns ``x`` itself.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return x
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return x
    if not 1 <= x.ndim <= _MAX_DIMS:
        raise ValueError(f"gather_batch: x must have 1 to {_MAX_DIMS} dimensions (batch first), got shape "
                         f"{tuple(x.shape)}")
    shape = torch.tensor([x.ndim] + list(x.shape) + [0] * (_MAX_DIMS - x.ndim), device=x.device, dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape, group=group)
    described = [tuple(s[1:1 + int(s[0])].tolist()) for s in torch.stack(shapes).cpu()]
    if any(s[1:] != described[0][1:] for s in described):
        raise ValueError(f"gather_batch: the processes' features differ beyond the batch dimension: shapes {described}")
    return _GatherRows.apply(x, [s[0] for s in described], dist.get_rank(group), group)
