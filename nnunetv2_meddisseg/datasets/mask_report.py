"""The mask report: what the mask rule (``image_io.read_binary_mask``) made of every mask, before anything is written.

It counts each kind, naming up to three files, and lists every refused mask with the rule and the way on
(``--mask_threshold T``, not for label maps, or ``--skip_ambiguous``); else ``MaskRuleError``, having written nothing.
"""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .cases import MASK_KINDS, REFUSED_KINDS, ConversionPlan, MaskFinding, SourceCase
from .errors import ConversionError

__all__ = ["MaskReport", "MaskRuleError", "survey_masks", "MASK_RULE", "WAY_ON", "WAY_ON_CLASSES"]

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
        for kind, n in self.counts().items():
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
            counts = self.counts()
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


def _inspect_one(inspect: Callable[[SourceCase, Optional[float]], MaskFinding], threshold: Optional[float],
                 case: SourceCase) -> MaskFinding:
    return inspect(case, threshold)


def survey_masks(plan: ConversionPlan, case_ids: Sequence[str], threshold: Optional[float] = None,
                 num_processes: int = 1, progress: bool = False) -> Optional[MaskReport]:
    """The rule's report on the masks of ``case_ids``; None where it does not apply (instance and organ labels)."""
    from tqdm import tqdm

    inspect = plan.spec.inspect_mask
    if inspect is None:
        return None
    cases: List[Tuple[str, SourceCase]] = [(c, plan.cases[c]) for c in case_ids]
    one = partial(_inspect_one, inspect, threshold)
    with tqdm(total=len(cases), desc="masks", unit="mask", disable=not progress) as bar:
        if num_processes <= 1 or len(cases) < 2:
            found = []
            for _, case in cases:
                found.append(one(case))
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=min(num_processes, len(cases)),
                                     mp_context=get_context("spawn")) as ex:
                found = []
                for finding in ex.map(one, [case for _, case in cases], chunksize=16):
                    found.append(finding)
                    bar.update()
    return MaskReport(Path(plan.source), {c: f for (c, _), f in zip(cases, found)}, threshold)
