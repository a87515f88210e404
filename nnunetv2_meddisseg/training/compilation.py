"""``torch.compile`` for the trainers: when it pays, static shapes, the seconds each graph took, and a way back.

nnU-Net's dynamic shapes would recompile on a change of batch (Stage I runs a doubled batch, Stage II the plans'
batch); ``compile_network`` uses static shapes: one graph per stage's training step. Only training steps compile:
validation, BatchNorm re-estimation and the final validation run eagerly, as a few dozen batches per epoch do not
repay graphs of their own. A compile error in any call drops the compiled code and repeats the call eagerly.
"""
import contextlib
import weakref
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, Sequence, TypeVar, Union

import torch
from torch import nn

__all__ = ["COMPILE_RECOMPILE_LIMIT", "COMPILE_COSTS", "CompileCosts", "CompileDecision", "compile_pays",
           "compile_network", "compile_error_summary", "eager_stance", "is_compile_error", "Compilation"]

T = TypeVar("T")

#: graphs a compiled module may hold (a stage's batch, a different last batch); dynamo's default (8) goes eager silently
COMPILE_RECOMPILE_LIMIT = 32


@dataclass(frozen=True)
class CompileCosts:
    """What compiling a stage's training step costs and saves, at 256x256 on the GPU the figures come from:
    ``compile_s`` of one stage's first step, ``eager_s_per_sample``, the ``saved_fraction`` of a step's time, and the
    ``pixels`` (H x W) of the per-sample figure, which other patches scale linearly."""

    compile_s: float
    eager_s_per_sample: float
    saved_fraction: float
    pixels: int = 256 * 256


#: From benchmarks/RESULTS.md ("GPU"): the first compiled Stage I step took 104 s, Stage II's had not finished after
#: 206 s (inductor); eager Stage II ran 39.5 images/s (fp32, batch 5); compiled inference saved 59 % of the time
#: (294 -> 712 images/s, batch 32, bf16) and stands in for the training step's saving, which is not measured.
COMPILE_COSTS = CompileCosts(compile_s=210.0, eager_s_per_sample=1 / 39.5, saved_fraction=0.59)


@dataclass(frozen=True)
class CompileDecision:
    """Whether a run compiles, and the figures that decided it (``compile_pays``)."""

    compile: bool
    reason: str

    def log_line(self) -> str:
        """The one line the training log gets: ``torch.compile: on (<reason>)`` or ``... off (<reason>)``."""
        return f"torch.compile: {'on' if self.compile else 'off'} ({self.reason})"


def compile_pays(stage_iterations: Sequence[int], batch_size: int, pixels: int,
                 costs: CompileCosts = COMPILE_COSTS) -> CompileDecision:
    """Compile when the seconds saved exceed ``costs.compile_s`` per stage that trains (``stage_iterations``)."""
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


def compile_network(network: nn.Module, backend: Union[str, Callable] = "inductor") -> nn.Module:
    """``torch.compile(network, dynamic=False)``: the network as one graph per input shape."""
    limit_name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    if getattr(torch._dynamo.config, limit_name) < COMPILE_RECOMPILE_LIMIT:
        setattr(torch._dynamo.config, limit_name, COMPILE_RECOMPILE_LIMIT)
    return torch.compile(network, backend=backend, dynamic=False)


def is_compile_error(error: BaseException) -> bool:
    """Whether torch.compile's machinery (dynamo, AOT autograd, inductor, a backend) raised ``error``."""
    from torch._dynamo import exc as dynamo_exc

    if isinstance(error, (dynamo_exc.TorchDynamoException, dynamo_exc.BackendCompilerFailed)):
        return True
    module = type(error).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch", "torch.fx", "triton"))


def eager_stance() -> ContextManager:
    """Within the block compiled modules run their eager code and compile nothing (``set_stance("force_eager")``)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def compile_error_summary(error: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of the innermost error ``error`` wraps (e.g. inside ``BackendCompilerFailed``)."""
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
    """A trainer's torch.compile state; ``uncompile`` makes the trainer call its plain network again."""

    def __init__(self, backend: Union[str, Callable], log: Callable[[str], None], uncompile: Callable[[], None]):
        self.backend, self.log, self._uncompile = backend, log, uncompile
        #: the trainer calls compiled code (cleared by a compile error)
        self.compiled = False
        #: seconds of the first call of each graph (compilation included), by graph name
        self.first_call_s: Dict[str, float] = {}
        #: the modules ``compile_module`` compiled in place
        self._compiled_in_place: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()

    def compile(self, network: nn.Module) -> nn.Module:
        """The module to call for ``network`` (plain): ``compile_network``; logs what was compiled."""
        compiled = compile_network(network, backend=self.backend)
        self.compiled = True
        backend = getattr(self.backend, "__name__", self.backend)
        threads = getattr(torch._inductor.config, "compile_threads", None) if backend == "inductor" else None
        workers = f", {threads} compile workers" if threads else ""
        self.log(f"torch.compile ({backend}) of the network, static shapes{workers}; only the training steps run "
                 f"compiled")
        return compiled

    def compile_module(self, module: nn.Module) -> None:
        """Where the network is compiled, compile ``module`` in place (it keeps its class and state-dict keys)."""
        if self.compiled:
            module.compile(backend=self.backend, dynamic=False)
            self._compiled_in_place.add(module)

    def first_call_done(self, graph: str, seconds: float) -> None:
        """Log the seconds of ``graph``'s first compiled call. Callers time graphs not yet in ``first_call_s`` while
        ``compiled``, and not a call that a compile error made eager."""
        self.first_call_s[graph] = seconds
        self.log(f'torch.compile: graph "{graph}" compiled in {seconds:.1f} s')

    def eager(self, function: Callable[..., T], *args) -> T:
        """``function(*args)`` with compiled modules running eagerly; repeated after a torch.compile error."""
        def run():
            with eager_stance():
                return function(*args)
        try:
            return run()
        except Exception as error:
            self.fall_back(error)
            return run()

    def fall_back(self, error: Exception) -> None:
        """Re-raise ``error`` unless torch.compile raised it; else log it, drop the compiled code and dynamo's cache."""
        if not self.compiled or not is_compile_error(error):
            raise error
        self._uncompile()
        for module in self._compiled_in_place:
            module._compiled_call_impl = None  # what nn.Module.compile set
        self._compiled_in_place.clear()
        torch._dynamo.reset()
        self.compiled = False
        self.log(f"WARNING: torch.compile failed ({compile_error_summary(error)}); training continues without "
                 f"compilation (set nnUNet_compile=f to skip compiling)")
