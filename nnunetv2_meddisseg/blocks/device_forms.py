"""Which implementation form a device-dependent block (the CDFA window attention) runs.

The forms agree up to rounding: ``"fused"`` (Triton custom ops, CUDA with Triton), ``"shifted"`` (in-place ops
on shifted views, the CPU and devices without the fused kernels), ``"graph"`` (whole-tensor ops for the ONNX
exporter: a tracer loses in-place writes into slices). A block's ``form`` is None (by the input's device) or a
form it runs on any device; ``"cuda"`` and ``"cpu"`` alias ``"fused"`` and ``"shifted"``. Where Triton cannot
build or run the fused kernels on a GPU, ``give_up_fused`` turns the fused form off for the process with one
warning; a block with a set ``form`` never falls back.
"""
import contextlib
import warnings
from typing import Iterator, List, Optional

from torch import Tensor, nn

from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available

__all__ = ["FORMS", "ALIASES", "resolve_form", "implementation_form", "form_blocks",
           "set_implementation_form", "implementation_form_of", "give_up_fused"]

#: the implementation forms
FORMS = ("fused", "shifted", "graph")
#: aliases: the form each device runs (CUDA: fused, where Triton builds it)
ALIASES = {"cuda": "fused", "cpu": "shifted"}
#: why the fused form is off for this process (``give_up_fused``), None while it is on
_fused_failure: Optional[str] = None


def resolve_form(form: Optional[str]) -> Optional[str]:
    """``form`` checked and with aliases resolved: one of :data:`FORMS`, or None (by device)."""
    if form is None:
        return None
    if form not in FORMS and form not in ALIASES:
        raise ValueError(f"unknown implementation form {form!r}: choose one of {list(FORMS) + list(ALIASES)}")
    return ALIASES.get(form, form)


def implementation_form(x: Tensor, form: Optional[str] = None) -> str:
    """``form`` if given, else ``"fused"`` for CUDA ``x`` if the fused kernels are available and not given up,
    else ``"shifted"``."""
    if form is not None:
        return resolve_form(form)
    fused = _fused_failure is None and x.device.type == "cuda" and fused_cdfa_available(x)
    return "fused" if fused else "shifted"


def form_blocks(module: nn.Module) -> List[nn.Module]:
    """The device-dependent blocks in ``module`` (itself included): the submodules with a ``form`` attribute."""
    return [m for m in module.modules() if hasattr(m, "form")]


def set_implementation_form(module: nn.Module, form: Optional[str]) -> None:
    """Set ``form`` (None: by device) on every device-dependent block in ``module``."""
    form = resolve_form(form)
    for block in form_blocks(module):
        block.form = form


@contextlib.contextmanager
def implementation_form_of(module: nn.Module, form: Optional[str]) -> Iterator[nn.Module]:
    """Within the context, every device-dependent block in ``module`` runs ``form``; then each gets its own back.
    Yields ``module``."""
    previous = [(block, block.form) for block in form_blocks(module)]
    try:
        set_implementation_form(module, form)
        yield module
    finally:
        for block, value in previous:
            block.form = value


def give_up_fused(reason: str) -> None:
    """Run the shifted form instead of the fused one from now on in this process, warning once with ``reason``."""
    global _fused_failure
    if _fused_failure is None:
        _fused_failure = reason
        warnings.warn(f"the fused CDFA kernels failed on this GPU ({reason}); Med-DisSeg continues with the "
                      f"shifted form (same results, slower)", RuntimeWarning, stacklevel=2)
