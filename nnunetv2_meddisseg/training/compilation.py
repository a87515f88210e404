"""``torch.compile`` for the trainers: when it pays, static shapes, the whole network or block by block, the seconds
each graph took, and a way back.

nnU-Net compiles the whole network (``torch.compile(self.network)``) where ``_do_i_compile`` says so, with
dynamo's automatic dynamic shapes: a change of batch (Stage I runs a doubled batch of clean and perturbed
views, Stage II the plans' batch) would recompile it with a symbolic batch. :func:`compile_network` compiles
with static shapes (``dynamic=False``) instead, so each stage's training step gets one graph and no stage
recompiles after its first step:

- ``whole`` (the trainer's default): one graph of the network per stage;
- ``regional``: each block compiled on its own (:func:`compile_regions`, ``nn.Module.compile``: the module
  keeps its class and state-dict keys). A block that occurs several times with the same shapes (the ResNet
  bottlenecks of one layer) traces to the same graph, which inductor's graph cache compiles once; on an H200
  the first compiled Stage I step still took longer this way (``benchmarks/RESULTS.md``).

:class:`Compilation` is a trainer's compile state: whether compiling pays for the run's schedule
(:func:`compile_pays`, with the figures of :data:`COMPILE_COSTS`), the compiled flag, the seconds of each graph's
first call in the log, and the way back: an error that compilation raises (:func:`is_compile_error`) in any call
it runs drops the compiled code and repeats the call eagerly. Only the training steps are compiled; validation,
BatchNorm re-estimation and the final validation run eagerly (:func:`eager_stance`): a few dozen batches per
epoch do not repay graphs of their own.
"""
import contextlib
from dataclasses import dataclass
from time import time
from typing import Callable, ContextManager, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

import torch
from torch import nn

__all__ = ["COMPILE_RECOMPILE_LIMIT", "COMPILE_SCOPES", "COMPILE_COSTS", "CompileCosts", "CompileDecision",
           "compile_pays", "compile_network", "compile_error_summary", "compile_regions", "eager_stance",
           "compiled_regions", "uncompile_regions", "is_compile_error", "region_modules",
           "Compilation"]

T = TypeVar("T")

#: what :func:`compile_network` compiles: the network as one graph, or each block on its own
COMPILE_SCOPES = ("whole", "regional")
#: graphs a compiled block may hold (a stage's batch, a different last batch); dynamo's default limit (8) would
#: fall back to eager silently
COMPILE_RECOMPILE_LIMIT = 32


@dataclass(frozen=True)
class CompileCosts:
    """What compiling a stage's training step costs and saves, at 256x256 on the GPU the figures come from.

    compile_s: seconds to compile one stage's training graph (its first step, compilation included).
    eager_s_per_sample: seconds of an eager training step per sample.
    saved_fraction: the part of a step's time that the compiled graph saves.
    pixels: the patch size (H x W) the per-sample figure was measured at; other patches scale it linearly.
    """

    compile_s: float
    eager_s_per_sample: float
    saved_fraction: float
    pixels: int = 256 * 256


#: Measured on one H200 (benchmarks/RESULTS.md, "GPU"): the first compiled Stage I step took 104 s and Stage II's
#: had not finished after 206 s (whole network, inductor); the eager Stage II step ran at 39.5 images/s (fp32,
#: batch 5); compiled inference ran 2.4x the eager images/s (294 -> 712 at batch 32, bf16), i.e. saved 59 % of
#: the time. The training step's own saving has not been measured: the inference figure stands in for it until
#: ``benchmarks/gpu.py`` measures both trainers' epochs eager and compiled.
COMPILE_COSTS = CompileCosts(compile_s=210.0, eager_s_per_sample=1 / 39.5, saved_fraction=0.59)


@dataclass(frozen=True)
class CompileDecision:
    """Whether a run compiles, and the figures that decided it (:func:`compile_pays`)."""

    compile: bool
    reason: str

    def log_line(self) -> str:
        """The one line the training log gets: ``torch.compile: on (<reason>)`` or ``... off (<reason>)``."""
        return f"torch.compile: {'on' if self.compile else 'off'} ({self.reason})"


def compile_pays(stage_iterations: Sequence[int], batch_size: int, pixels: int,
                 costs: CompileCosts = COMPILE_COSTS) -> CompileDecision:
    """Compile where the schedule repays it: each stage that trains (``stage_iterations``: its training
    iterations) costs ``costs.compile_s`` once, and every iteration saves
    ``costs.saved_fraction * costs.eager_s_per_sample * batch_size * pixels / costs.pixels`` seconds. Compiles
    when the saving over all iterations exceeds the compile seconds of every stage that trains."""
    stages = [n for n in stage_iterations if n > 0]
    iterations = sum(stages)
    compile_s = costs.compile_s * len(stages)
    saved_per_iteration = costs.saved_fraction * costs.eager_s_per_sample * batch_size * pixels / costs.pixels
    saved_s = saved_per_iteration * iterations
    pays = iterations > 0 and saved_s > compile_s
    reason = (f"{iterations} training iterations x {saved_per_iteration:.4f} s saved each = {saved_s:.0f} s "
              f"{'>' if pays else '<='} {compile_s:.0f} s of compilation for {len(stages)} graph(s); estimated, "
              f"nnUNet_compile=t / f decides instead")
    return CompileDecision(pays, reason)


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


class Compilation:
    """A trainer's torch.compile: what it compiled, the seconds of each graph's first call, and the way back.

    Args:
        backend: the torch.compile backend (a name or a callable).
        scope: "whole" or "regional" (:func:`compile_network`).
        log: writes one line to the training log.
        uncompile: makes the trainer call its plain modules again (called once, after a compile error).
    """

    def __init__(self, backend: Union[str, Callable], scope: str, log: Callable[[str], None],
                 uncompile: Callable[[], None]):
        if scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope must be one of {', '.join(COMPILE_SCOPES)}, got {scope!r}")
        self.backend, self.scope, self.log, self._uncompile = backend, scope, log, uncompile
        #: the trainer calls compiled code (cleared by a compile error)
        self.compiled = False
        #: seconds of the first call of each graph (compilation included), by graph name
        self.first_call_s: Dict[str, float] = {}

    def compile(self, network: nn.Module) -> nn.Module:
        """The module to call for ``network`` (plain) compiled as :attr:`scope` says; logs what was compiled."""
        compiled, what = compile_network(network, self.scope, backend=self.backend)
        self.compiled = True
        backend = getattr(self.backend, "__name__", self.backend)
        threads = getattr(torch._inductor.config, "compile_threads", None) if backend == "inductor" else None
        workers = f", {threads} compile workers" if threads else ""
        self.log(f"torch.compile ({backend}) of {what}, static shapes{workers}; only the training steps run "
                 f"compiled")
        return compiled

    def compile_module(self, module: nn.Module) -> None:
        """Compile ``module`` (plain) in place with static shapes where the network is compiled."""
        if self.compiled:
            module.compile(backend=self.backend, dynamic=False)

    def call(self, graph: str, function: Callable[..., T], *args) -> T:
        """``function(*args)``; where compiled, the first call for ``graph`` logs its seconds
        (``torch.compile: graph "<graph>" compiled in <s> s``, the call's seconds with compilation included), and
        after an error of torch.compile the compiled code goes and the call is repeated eagerly."""
        timed = self.compiled and graph not in self.first_call_s
        start = time()
        try:
            result = function(*args)
        except Exception as error:
            self._continue_eagerly(error)
            return function(*args)
        if timed and self.compiled:
            self.first_call_s[graph] = time() - start
            self.log(f'torch.compile: graph "{graph}" compiled in {self.first_call_s[graph]:.1f} s')
        return result

    def eager(self, function: Callable[..., T], *args) -> T:
        """``function(*args)`` with every compiled module running its eager code (:func:`eager_stance`), behind
        the same fallback as :meth:`call`."""
        def run():
            with eager_stance():
                return function(*args)
        try:
            return run()
        except Exception as error:
            self._continue_eagerly(error)
            return run()

    def _continue_eagerly(self, error: Exception) -> None:
        """Re-raise ``error`` unless torch.compile raised it; else drop the compiled code and dynamo's caches and
        say so in one line of the log."""
        if not self.compiled or not is_compile_error(error):
            raise error
        self._uncompile()
        torch._dynamo.reset()
        self.compiled = False
        self.log(f"WARNING: torch.compile failed ({compile_error_summary(error)}); training continues without "
                 f"compilation (set nnUNet_compile=f to skip compiling)")
