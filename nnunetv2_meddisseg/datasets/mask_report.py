"""The mask report: what the mask rule (``image_io.read_binary_mask``) made of every mask, before anything is written.

It counts each kind, naming up to three files, and lists every refused mask with the rule and the way on
(``--mask_threshold T``, not for label maps, or ``--skip_ambiguous``); else ``MaskRuleError``, having written nothing.
"""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import starmap
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .cases import MASK_KINDS, REFUSED_KINDS, ConversionPlan, MaskFinding
from .errors import ConversionError

__all__ = ["MaskReport", "MaskRuleError", "survey_masks", "run_in_workers", "MASK_RULE", "WAY_ON", "WAY_ON_CLASSES"]

#: the rule in one line (the report, dataset.json's conversion record)
MASK_RULE = ("masks holding 0 and one value (or 0/1) are that label; in any other mask, values at or below 25 % of "
             "its range are background, at or above 75 % foreground, and a value in between is foreground above "
             "half the range where it covers at most 1 % of the mask (anti-aliased edges), ambiguous where it covers "
             "more; a mask with non-zero values that would be written empty, or holding several classes (two "
             "low-band values or two colour hues each over 1 % of the mask), is refused; JPEG masks are read by "
             "the levels of their histogram (each with the values within 5 % of the range of it, its noise) "
             "instead of single values, and one whose levels are 0 and 1 is a 0/1 label")
#: how to go on where masks are refused
WAY_ON = ("pass --mask_threshold T (foreground: the mask values above T) or --skip_ambiguous (those cases are left "
          "out and named)")
#: how to go on where every refused mask holds several classes (a threshold cannot make a label map binary)
WAY_ON_CLASSES = ("save them as binary masks (0 and one foreground value), or pass --skip_ambiguous (those cases are "
                  "left out and named)")

#: the report's words for each of ``MASK_KINDS``, and what the rule (without ``--mask_threshold``) did with them
_KIND_WORDS = {
    "label": ("binary (0 and one value, or 0/1)", "kept as they are"),
    "faint": ("with faint background values (at most 25 % of the range, over 1 % of the mask)", "read as background"),
    "edges": ("with anti-aliased edges", "thresholded at half their range"),
    "lossy": ("JPEG masks", "thresholded at half their range"),
    "lossy_label": ("JPEG masks of 0/1 labels (values near 0 and 1)", "read as 0/1 (foreground from 1 up)"),
    "middle": ("with middle values (over 1 % of the mask)", ""),
    "ambiguous": ("ambiguous (a middle value covers over 1 % of the mask)", ""),
    "empty": ("that would be written empty although they hold non-zero values", ""),
    "classes": ("holding more classes than the dataset's two (label maps)", ""),
}
_SHOWN = 3


class MaskRuleError(ConversionError):
    """Masks the rule refuses, without ``--mask_threshold`` or ``--skip_ambiguous``; ``report`` lists them all."""

    def __init__(self, message: str, report: "MaskReport"):
        super().__init__(message)
        self.report = report


@dataclass
class MaskReport:
    """The rule's ``findings`` (case ID -> ``MaskFinding``); ``left_out``: the cases ``--skip_ambiguous`` dropped."""

    source: Path
    findings: Dict[str, MaskFinding]
    threshold: Optional[float] = None
    left_out: List[str] = field(default_factory=list)

    @property
    def refused(self) -> List[str]:
        """Case IDs whose mask the rule refuses, in case order."""
        return [c for c, f in self.findings.items() if f.refused]

    def counts(self) -> Dict[str, int]:
        return {kind: sum(f.kind == kind for f in self.findings.values()) for kind in MASK_KINDS}

    def _name(self, path: Path) -> str:
        try:
            return Path(path).relative_to(self.source).as_posix()
        except ValueError:
            return str(path)

    def summary_lines(self) -> List[str]:
        """A line per kind found (up to three files each), then the refused masks, the rule and the way on (or, with
        ``--skip_ambiguous``, the cases left out)."""
        if self.threshold is None:
            lines = [f"masks: {len(self.findings)} read by the mask rule"]
        else:
            lines = [f"masks: {len(self.findings)} read; all but the binary ones thresholded at --mask_threshold "
                     f"{self.threshold:g}"]
        counts = self.counts()
        for kind, n in counts.items():
            if not n or kind in REFUSED_KINDS:
                continue
            what, done = _KIND_WORDS[kind]
            line = f"  {n} {what}" + (f" {done}" if done and self.threshold is None else "")
            if kind != "label":
                names = [self._name(f.path) for f in self.findings.values() if f.kind == kind]
                more = f" ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
                line += ": " + ", ".join(names[:_SHOWN]) + more
            lines.append(line)
        refused = self.refused
        if refused:
            kinds = " and ".join(f"{counts[k]} {_KIND_WORDS[k][0]}" for k in REFUSED_KINDS if counts[k])
            verb = "left out (--skip_ambiguous)" if self.left_out else "refused"
            lines.append(f"  {kinds}, {verb}:")
            lines += [f"    {self.findings[c].problem}" for c in refused]
            lines.append(f"  rule: {MASK_RULE}")
            if not self.left_out:
                lines.append(f"  to go on: {self.way_on()}")
        return lines

    def way_on(self) -> str:
        """``WAY_ON``, or ``WAY_ON_CLASSES`` where every refused mask is a label map."""
        return WAY_ON_CLASSES if all(self.findings[c].kind == "classes" for c in self.refused) else WAY_ON

    def refusal_message(self) -> str:
        """The one-line error of a conversion refused for its masks."""
        refused = self.refused
        return (f"{len(refused)} of {len(self.findings)} masks are refused by the mask rule (all listed in the report "
                f"above), the first: {self.findings[refused[0]].problem}; {self.way_on()}; nothing was written")

    def record(self) -> dict:
        """The report for dataset.json's conversion record."""
        rule = MASK_RULE if self.threshold is None else (
            f"masks holding 0 and one value (or 0/1) are that label; in any other mask the values above "
            f"{self.threshold:g} (--mask_threshold) are foreground; a mask with non-zero values that would be "
            f"written empty, or holding several classes, is refused")
        return {"rule": rule,
                "mask_threshold": self.threshold,
                "counts": {k: n for k, n in self.counts().items() if n},
                "left_out": {c: self.findings[c].problem for c in self.left_out}}


def run_in_workers(fn: Callable, args: Sequence[tuple], num_processes: int, progress: bool, desc: str, unit: str,
                   chunksize: int = 1) -> list:
    """``[fn(*a) for a in args]`` under a progress bar, in spawned worker processes where ``num_processes`` > 1 (a
    failure cancels the calls not yet started)."""
    from tqdm import tqdm

    if num_processes <= 1 or len(args) < 2:
        return list(tqdm(starmap(fn, args), total=len(args), desc=desc, unit=unit, disable=not progress))
    with ProcessPoolExecutor(max_workers=min(num_processes, len(args)), mp_context=get_context("spawn")) as ex:
        results = ex.map(fn, *zip(*args), chunksize=chunksize)
        return list(tqdm(results, total=len(args), desc=desc, unit=unit, disable=not progress))


def survey_masks(plan: ConversionPlan, case_ids: Sequence[str], threshold: Optional[float] = None,
                 num_processes: int = 1, progress: bool = False) -> Optional[MaskReport]:
    """The rule's report on the masks of ``case_ids``; None where it does not apply (instance and organ labels)."""
    inspect = plan.spec.inspect_mask
    if inspect is None:
        return None
    found = run_in_workers(inspect, [(plan.cases[c], threshold) for c in case_ids], num_processes, progress, "masks",
                           "mask", chunksize=16)
    return MaskReport(Path(plan.source), dict(zip(case_ids, found)), threshold)
