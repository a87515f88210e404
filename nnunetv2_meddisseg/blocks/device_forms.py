"""Which implementation form a device-dependent block (the CDFA window attention) runs.

The forms have equal results up to rounding:

- ``"fused"``: Triton kernels registered as custom ops (``blocks.cdfa_kernels``), what CUDA runs when
  Triton is installed;
- ``"shifted"``: many small in-place operations on shifted views (no large intermediates), what the CPU
  and every device without the fused kernels run;
- ``"graph"``: whole-tensor operations on padded copies, no in-place writes (``blocks.cdfa_graph``), what
  the ONNX exporter traces (a tracer loses in-place writes into slices).

A block calls :func:`implementation_form` with its input. :func:`forced_form` overrides the choice
(for tests, benchmarks and the exporter, which run one form on any device). ``"cuda"`` and ``"cpu"`` are
accepted as aliases of what those devices run: ``"fused"`` and ``"shifted"``. Where Triton cannot build or
run the fused kernels on a GPU, :func:`give_up_fused` turns the fused form off for the process, with one warning
naming the error.
"""
import contextlib
import warnings
from typing import Iterator, Optional

from torch import Tensor

from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available

__all__ = ["FORMS", "ALIASES", "implementation_form", "forced_form", "form_is_forced", "give_up_fused"]

#: the implementation forms
FORMS = ("fused", "shifted", "graph")
#: other accepted names: the form each device runs (CUDA: fused, where Triton builds it; CPU: shifted)
ALIASES = {"cuda": "fused", "cpu": "shifted"}
_forced: Optional[str] = None
#: why the fused form is off for this process (``give_up_fused``), None while it is on
_fused_failure: Optional[str] = None


def implementation_form(x: Tensor) -> str:
    """The form a block given ``x`` runs: the forced one (:func:`forced_form`), else ``"fused"`` for CUDA
    tensors where the fused kernels are available, ``"shifted"`` otherwise."""
    if _forced is not None:
        return _forced
    fused = _fused_failure is None and x.device.type == "cuda" and fused_cdfa_available(x)
    return "fused" if fused else "shifted"


def form_is_forced() -> bool:
    """Whether :func:`forced_form` chooses the form now."""
    return _forced is not None


def give_up_fused(reason: str) -> None:
    """Run the shifted form instead of the fused one from now on in this process, warning once with ``reason``."""
    global _fused_failure
    if _fused_failure is None:
        _fused_failure = reason
        warnings.warn(f"the fused CDFA kernels failed on this GPU ({reason}); Med-DisSeg continues with the "
                      f"shifted form (same results, slower)", RuntimeWarning, stacklevel=2)


@contextlib.contextmanager
def forced_form(form: Optional[str]) -> Iterator[None]:
    """Within the context, every device-dependent block runs ``form`` (one of :data:`FORMS` or
    :data:`ALIASES`; None: by device)."""
    global _forced
    if form is not None:
        if form not in FORMS and form not in ALIASES:
            raise ValueError(f"unknown implementation form {form!r}: choose one of {list(FORMS) + list(ALIASES)}")
        form = ALIASES.get(form, form)
    previous, _forced = _forced, form
    try:
        yield
    finally:
        _forced = previous
