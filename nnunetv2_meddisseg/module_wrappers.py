"""The plain module inside the wrappers that training puts around a network: ``DistributedDataParallel`` (``-num_gpus
N``) and torch.compile's ``OptimizedModule``. The trainers, the exporter and the feature pictures read the plain
module's weights and attributes through :func:`unwrap_module`."""
from typing import Optional

from torch import nn
from torch._dynamo import OptimizedModule
from torch.nn.parallel import DistributedDataParallel

__all__ = ["unwrap_module"]


def unwrap_module(module: Optional[nn.Module]) -> Optional[nn.Module]:
    """The plain module inside DistributedDataParallel and / or torch.compile wrappers (``module`` itself where it
    has none; None stays None)."""
    if isinstance(module, DistributedDataParallel):
        module = module.module
    if isinstance(module, OptimizedModule):
        module = module._orig_mod
    return module
