"""``torch.compile`` for the trainers: static shapes, the whole network or block by block, and a way back.

nnU-Net compiles the whole network (``torch.compile(self.network)``) where ``_do_i_compile`` says so, with
dynamo's automatic dynamic shapes: a change of batch (Stage I runs a doubled batch of clean and perturbed
views, Stage II the plans' batch) would recompile it with a symbolic batch. :func:`compile_network` compiles
with static shapes (``dynamic=False``) instead, so each (stage, mode) gets one graph and no stage recompiles
after its first step:

- ``whole`` (the trainer's default): one graph of the network per stage and mode;
- ``regional``: each block compiled on its own (:func:`compile_regions`, ``nn.Module.compile``: the module
  keeps its class and state-dict keys). A block that occurs several times with the same shapes (the ResNet
  bottlenecks of one layer) traces to the same graph, which inductor's graph cache compiles once; on an H200
  the first compiled Stage I step still took longer this way (``benchmarks/RESULTS.md``).

:func:`is_compile_error` recognises the errors that compilation raises (in dynamo, AOT autograd or the
backend); the trainer then drops the compiled code (:func:`uncompile_regions` for compiled blocks) and repeats
the step eagerly. :func:`compile_trainer_network`, :func:`continue_eagerly` and :func:`timed_first_step` are
``nnUNetTrainerMedDisSeg``'s compile handling, called by its methods of the same names.
"""
import contextlib
from time import time
from typing import Callable, ContextManager, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn
from torch._dynamo import OptimizedModule
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["COMPILE_RECOMPILE_LIMIT", "COMPILE_SCOPES", "compile_network", "compile_error_summary", "compile_regions",
           "eager_stance", "compiled_regions", "uncompile_regions", "is_compile_error",
           "region_modules", "compile_trainer_network", "continue_eagerly", "timed_first_step", "compiled_step"]

#: what :func:`compile_network` compiles: the network as one graph, or each block on its own
COMPILE_SCOPES = ("whole", "regional")
#: graphs a compiled block may hold: (Stage I, Stage II) x (training, validation, BatchNorm re-estimation,
#: final validation) with their batch sizes; dynamo's default limit (8) would fall back to eager silently
COMPILE_RECOMPILE_LIMIT = 32


def region_modules(network: nn.Module) -> List[nn.Module]:
    """The blocks :func:`compile_regions` compiles: ``network.compile_regions()`` where the network defines
    it, else its direct children with parameters (``nn.ModuleList`` / ``nn.Sequential`` items one by one)."""
    regions = getattr(network, "compile_regions", None)
    if callable(regions):
        return list(regions())
    found: List[nn.Module] = []
    for child in network.children():
        items: Iterable[nn.Module] = child if isinstance(child, (nn.ModuleList, nn.Sequential)) else [child]
        found.extend(m for m in items if any(True for _ in m.parameters()))
    return found


def _raise_recompile_limit() -> None:
    limit_name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    if getattr(torch._dynamo.config, limit_name) < COMPILE_RECOMPILE_LIMIT:
        setattr(torch._dynamo.config, limit_name, COMPILE_RECOMPILE_LIMIT)


def compile_network(network: nn.Module, scope: str = "whole",
                    backend: Union[str, Callable] = "inductor") -> Tuple[nn.Module, str]:
    """(the module to call, what was compiled): ``torch.compile(network, dynamic=False)`` for ``scope``
    "whole", ``network`` itself with its blocks compiled in place (:func:`compile_regions`) for "regional"."""
    if scope == "regional":
        return network, f"{len(compile_regions(network, backend=backend))} blocks of the network"
    if scope != "whole":
        raise ValueError(f"scope must be one of {', '.join(COMPILE_SCOPES)}, got {scope!r}")
    _raise_recompile_limit()
    return torch.compile(network, backend=backend, dynamic=False), "the network"


def compile_regions(network: nn.Module, backend: Union[str, Callable] = "inductor",
                    mode: Optional[str] = None) -> List[nn.Module]:
    """Compile each block of ``network`` in place (:func:`region_modules`), static shapes; returns the blocks.

    Nothing is traced until the first forward: errors of compilation surface there
    (:func:`is_compile_error`)."""
    _raise_recompile_limit()
    modules = region_modules(network)
    for module in modules:
        module.compile(backend=backend, mode=mode, dynamic=False)
    return modules


def compiled_regions(network: nn.Module) -> List[nn.Module]:
    """The submodules of ``network`` that ``nn.Module.compile`` compiled."""
    return [m for m in network.modules() if getattr(m, "_compiled_call_impl", None) is not None]


def uncompile_regions(network: nn.Module) -> int:
    """Undo :func:`compile_regions` on ``network`` (every compiled submodule runs eagerly again) and drop
    dynamo's caches; returns the number of blocks that were compiled."""
    modules = compiled_regions(network)
    for module in modules:
        module._compiled_call_impl = None
    torch._dynamo.reset()
    return len(modules)


def is_compile_error(error: BaseException) -> bool:
    """Whether ``error`` was raised by torch.compile's machinery (dynamo, AOT autograd, inductor or another
    backend) rather than by the model's own code."""
    from torch._dynamo import exc as dynamo_exc

    if isinstance(error, (dynamo_exc.TorchDynamoException, dynamo_exc.BackendCompilerFailed)):
        return True
    module = type(error).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch", "torch.fx", "triton"))


def eager_stance() -> ContextManager:
    """Within the block, compiled modules run their eager code and compile nothing
    (``torch.compiler.set_stance("force_eager")``)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def compile_error_summary(error: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of the innermost error that ``error`` wraps (a backend's own error inside dynamo's
    ``BackendCompilerFailed``), for one line of a log."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "inner_exception", None) or error.__cause__
        if inner is None:
            break
        error = inner
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first[:limit]}" if first else type(error).__name__


def compile_trainer_network(trainer) -> None:
    """Where nnU-Net compiled ``trainer.network`` (``_do_i_compile``), compile it again as ``trainer.compile_scope``
    says, with static shapes (:func:`compile_network`: one graph per stage and mode, no recompilation within a
    stage); the Stage I head, where there is one, is compiled too (else when it is built)."""
    from nnunetv2_meddisseg.training.extended_trainer import unwrap_module

    holder = trainer.network.module if isinstance(trainer.network, DDP) else trainer.network
    if not isinstance(holder, OptimizedModule):
        return
    if trainer.compile_scope not in COMPILE_SCOPES:
        raise ValueError(f"{type(trainer).__name__}.compile_scope must be one of {', '.join(COMPILE_SCOPES)}, got "
                         f"{trainer.compile_scope!r}")
    plain = holder._orig_mod
    if trainer.device.type == "cuda" and hasattr(plain, "_use_channels_last"):
        plain._use_channels_last()  # the layout the compiled graphs see (an eager forward sets it itself)
    compiled, what = compile_network(plain, trainer.compile_scope, backend=trainer.compile_backend)
    trainer._set_network(compiled)
    trainer.compiled = True
    if trainer.stage1_head is not None:
        unwrap_module(trainer.stage1_head).compile(backend=trainer.compile_backend, dynamic=False)
    backend = getattr(trainer.compile_backend, "__name__", trainer.compile_backend)
    trainer.print_to_log_file(f"torch.compile ({backend}) of {what}, static shapes (nnUNet_compile=f runs eagerly)")


def continue_eagerly(trainer, error: Exception) -> None:
    """After ``error`` in a compiled step of ``trainer``: re-raise it unless torch.compile raised it; else undo
    the compilation, say so in one line of the log, and let the caller repeat the step eagerly."""
    if not trainer.compiled or not is_compile_error(error):
        raise error
    plain = trainer._plain_network()
    trainer._set_network(plain)  # the whole-network wrapper goes
    uncompile_regions(plain)  # and so do compiled blocks, the head's too; dynamo's caches are dropped
    if trainer._plain_head() is not None:
        uncompile_regions(trainer._plain_head())
    trainer.compiled = False
    trainer.print_to_log_file(f"WARNING: torch.compile failed ({compile_error_summary(error)}); training "
                              f"continues without compilation (set nnUNet_compile=f to skip compiling)")


def compiled_step(trainer, kind: str, step: Callable[[dict], dict], batch: dict) -> dict:
    """``step(batch)`` of ``trainer`` (``kind``: "training" or "validation"), its first one per stage timed
    (:func:`timed_first_step`); after a compile error (:func:`continue_eagerly`) repeated once, eagerly."""
    with timed_first_step(trainer, kind):
        try:
            return step(batch)
        except Exception as error:
            continue_eagerly(trainer, error)
            return step(batch)


@contextlib.contextmanager
def timed_first_step(trainer, kind: str):
    """Log the seconds of the first ``kind`` step of each stage where ``trainer``'s network is compiled (its graphs
    are compiled in that step; the step ends with a transfer to the host, so no extra synchronisation)."""
    from nnunetv2_meddisseg.training.stage_losses import STAGE_1

    key = (kind, trainer.training_stage)
    if not trainer.compiled or key in trainer._timed_steps:
        yield
        return
    trainer._timed_steps.add(key)
    start = time()
    yield
    stage = "I" if trainer.training_stage == STAGE_1 else "II"
    trainer.print_to_log_file(f"first {kind} step of Stage {stage}: {time() - start:.1f} s (compilation included)")
