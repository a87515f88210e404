"""Which implementation form a device-dependent block runs.

Some blocks have two forms with equal results: a *few-op* form (a handful of large operations: on a
GPU every operation is at least one kernel launch, so the launch count, not the arithmetic, bounds
their speed) and a *CPU* form (many small in-place operations on shifted views: no large
intermediates, faster on a CPU). A block calls :func:`few_op_form` with its input and runs the
few-op form on every device but the CPU. :func:`forced_form` overrides the choice (for tests and
benchmarks that check or count one form on the CPU).
"""
import contextlib
from typing import Iterator, Optional

from torch import Tensor

__all__ = ["FORMS", "few_op_form", "forced_form"]

#: "cuda": the few-op form (what every non-CPU device runs); "cpu": the CPU form
FORMS = ("cuda", "cpu")
_forced: Optional[str] = None


def few_op_form(x: Tensor) -> bool:
    """Whether a block given ``x`` runs its few-op form: off the CPU, unless :func:`forced_form` says otherwise."""
    if _forced is not None:
        return _forced == "cuda"
    return x.device.type != "cpu"


@contextlib.contextmanager
def forced_form(form: Optional[str]) -> Iterator[None]:
    """Within the context, every device-dependent block runs ``form`` ("cuda" | "cpu"; None: by device)."""
    global _forced
    if form is not None and form not in FORMS:
        raise ValueError(f"unknown implementation form {form!r}: choose one of {list(FORMS)}")
    previous, _forced = _forced, form
    try:
        yield
    finally:
        _forced = previous
