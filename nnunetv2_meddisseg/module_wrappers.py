"""The plain module inside a network's training wrappers: ``DistributedDataParallel`` and ``OptimizedModule``."""
from typing import Optional

from torch import nn
from torch._dynamo import OptimizedModule
from torch.nn.parallel import DistributedDataParallel

__all__ = ["unwrap_module"]


def unwrap_module(module: Optional[nn.Module]) -> Optional[nn.Module]:
    """``module`` without its DistributedDataParallel and torch.compile wrappers (None stays None)."""
    if isinstance(module, DistributedDataParallel):
        module = module.module
    if isinstance(module, OptimizedModule):
        module = module._orig_mod
    return module
