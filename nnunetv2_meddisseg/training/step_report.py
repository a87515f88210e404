"""What a training step reports, read from the device in one transfer: the loss, every logged term, each group's
gradient norm before clipping, and whether the batch held NaN / inf. On a GPU every read is a synchronisation, so
``step_report`` stacks the 0-dim tensors and the batch's per-sample finiteness flags and copies them once."""
from typing import Dict, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError
from nnunetv2_meddisseg.training.finite_input import Where, non_finite_input_message

__all__ = ["PendingInputCheck", "group_gradient_norms", "step_report"]


class PendingInputCheck(NamedTuple):
    """A training batch's finiteness flags (B,) on the device (``finite_per_sample``, no sync), case keys and
    origin, read with the step's report."""

    finite: torch.Tensor
    keys: Optional[Sequence[str]]
    where: Where


def group_gradient_norms(optimizer: torch.optim.Optimizer) -> Dict[str, torch.Tensor]:
    """``{"grad_norm_<group name>": L2 norm}`` per optimizer group (unnamed: its index, or ``network`` for a single
    group), 0-dim fp32 tensors on the device, no sync."""
    norms: Dict[str, torch.Tensor] = {}
    for i, group in enumerate(optimizer.param_groups):
        grads = [p.grad.detach() for p in group["params"] if p.grad is not None]
        if grads:
            name = group.get("name", "network" if len(optimizer.param_groups) == 1 else i)
            per_tensor = torch._foreach_norm(grads)
            norms[f"grad_norm_{name}"] = torch.linalg.vector_norm(torch.stack(per_tensor).float())
    return norms


def step_report(total: torch.Tensor, scalars: Mapping[str, torch.Tensor],
                check: Optional[PendingInputCheck] = None) -> dict:
    """A ``train_step`` result from one transfer: ``loss`` (a 0-dim array, as nnU-Net's) and each of ``scalars`` as
    a float; a ``TrainingInputRuntimeError`` naming the case instead where ``check`` flags NaN / inf."""
    names = list(scalars)
    parts = [total.detach().float().reshape(1)] + [scalars[n].detach().float().reshape(1) for n in names]
    if check is not None:
        parts.append(check.finite.float())
    host = torch.cat(parts).cpu().numpy()
    if check is not None:
        finite = host[1 + len(names):] > 0
        if not finite.all():
            raise TrainingInputRuntimeError(non_finite_input_message(finite.tolist(), check.keys, check.where))
    return {"loss": np.array(host[0]), **{n: float(v) for n, v in zip(names, host[1:])}}
