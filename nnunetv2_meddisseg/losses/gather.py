"""The global batch of a data-parallel run, for losses whose samples are each other's negatives.

Under ``torch.distributed`` (nnU-Net's ``-num_gpus N``) each process holds only its share ``H_r`` (B_r, ...) of the
batch, and a pairwise loss on ``H_r`` sees ``B_r (B_r - 1)`` pairs instead of ``B (B - 1)``, none when ``B_r = 1``.
``gather_batch`` returns ``H = [H_0; ...; H_{R-1}]`` (B, ...) on every process, so ``L(gather_batch(H_r)) = L(H)``.

Gradient. The other processes' rows are constants; process r's rows keep their gradient, times the world size R,
so r back-propagates ``R dL/dH_r``. DDP averages the R parameter gradients, so the parameters receive
``(1/R) sum_r R dL/dH_r dH_r/dtheta = dL/dtheta``, one process's gradient on the whole batch (as the segmentation
loss, a per-process mean, averages to the whole batch's when the shares are equal); summed over the processes,
``R dL/dtheta``. Without the factor R the regulariser would weaken as GPUs are added. A gradient-carrying
all-gather (``torch.distributed.nn.functional.all_gather``) would give the same ``sum_s dL/dH_r = R dL/dH_r``, as
every process computes the same ``L`` from the same ``H``, for a second B x D collective per backward. Valid while
every process computes the same function of ``H`` (true for every form in ``losses.dispersive``).

Cost: ``(B - B_r) D`` values received per call in the features' dtype (fp16 / bf16 under autocast), plus a small
all-gather of the shapes (shares may differ: nnU-Net splits a batch of 5 over 2 GPUs as 3 + 2). Every process must
call it, in the same order.
"""
from typing import List, Optional

import torch
from torch import Tensor
from torch import distributed as dist

__all__ = ["gather_batch"]

_MAX_DIMS = 8


class _GatherRows(torch.autograd.Function):
    """forward: (B_r, ...) -> (B, ...), every process's share in rank order; backward: this process's rows'
    gradient times the world size."""

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
    """The batch of every process of ``group`` (default: the world) in rank order: (sum_r B_r, ...), x's dtype, device.
    x: (B_r, ...), the shares may differ in B_r only. This process's rows carry x's gradient times the world size, the
    others are constants. Without a process group, or with one process, returns ``x`` itself."""
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
