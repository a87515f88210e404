"""Train / val / test lists: seeded draws, the lists shipped in ``splits/``, ``--split_file``."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import numpy as np

from .cases import ConversionPlan, DatasetSpec, SourceCase
from .errors import OptionError
from .image_io import short_error
from .source_files import describe_more

__all__ = ["SPLIT_SEED", "make_seeded_split", "holdout_count", "load_shipped_split", "plan_from_shipped_split",
           "read_split_file", "apply_split", "leave_out_cases"]

SPLIT_SEED = 12345  # seed of every converter split (the shipped Kvasir lists, run-time hold-outs)


def make_seeded_split(case_ids: Iterable[str], n_val: int, n_test: int,
                      seed: int = SPLIT_SEED) -> Tuple[List[str], List[str], List[str]]:
    """A reproducible split: the sorted IDs permuted by ``numpy.random.RandomState(seed)`` (stable across numpy
    versions); the first ``n_test`` are test, the next ``n_val`` val, the rest train; each list sorted."""
    ids = sorted(case_ids)
    if n_val < 0 or n_test < 0 or n_val + n_test > len(ids):
        raise ValueError(f"cannot take {n_val} val and {n_test} test cases from {len(ids)}")
    order = np.random.RandomState(seed).permutation(len(ids))
    test = sorted(ids[i] for i in order[:n_test])
    val = sorted(ids[i] for i in order[n_test:n_test + n_val])
    train = sorted(ids[i] for i in order[n_test + n_val:])
    return train, val, test


def holdout_count(n: int, fraction: float = 0.1) -> int:
    """Size of a validation hold-out: ``round(fraction * n)``, at least 1 when ``n >= 2``."""
    if n < 2:
        return 0
    return max(1, int(round(fraction * n)))


def load_shipped_split(filename: str) -> dict:
    """A split list shipped in ``nnunetv2_meddisseg/datasets/splits/``."""
    text = resources.files("nnunetv2_meddisseg.datasets").joinpath("splits", filename).read_text(encoding="utf-8")
    return json.loads(text)


def plan_from_shipped_split(spec: DatasetSpec, source: Path, cases: Dict[str, SourceCase], filename: str,
                            dataset: str) -> ConversionPlan:
    """A plan with a shipped split, or with a ``split_problem`` where the source's case IDs differ from the list."""
    shipped = load_shipped_split(filename)
    listed = set(shipped["train"]) | set(shipped["val"]) | set(shipped["test"])
    found = set(cases)
    if listed != found:
        missing, extra = sorted(listed - found), sorted(found - listed)
        parts = []
        if missing:
            parts.append(f"{len(missing)} listed cases are missing (e.g. {missing[0]})")
        if extra:
            parts.append(f"{len(extra)} cases are not in the list (e.g. {extra[0]})")
        problem = (f"{dataset}: the cases in {source} do not match the shipped split splits/{filename}: "
                   f"{'; '.join(parts)}; pass your own lists with --split_file")
        return ConversionPlan(spec, source, cases, [], [], [], split_origin="", split_problem=problem)
    return ConversionPlan(spec, source, cases, list(shipped["train"]), list(shipped["val"]), list(shipped["test"]),
                          split_origin=f"shipped splits/{filename}: {shipped.get('description', '')}".strip())


def read_split_file(path: Path) -> Tuple[List[str], List[str], List[str]]:
    """``--split_file``: a JSON object of case-ID lists ``train``, ``val``, ``test`` (the last two optional)."""
    path = Path(path)
    if not path.is_file():
        raise OptionError(f"--split_file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OptionError(f"--split_file {path} is not valid JSON: {short_error(err)}") from None
    if not isinstance(data, dict):
        raise OptionError(f"--split_file {path} must hold a JSON object with lists 'train', 'val', 'test'")
    unknown = sorted(set(data) - {"train", "val", "test", "description"})
    if unknown:
        raise OptionError(f"--split_file {path} has unknown key {unknown[0]!r} (expected train, val, test)")
    lists: Dict[str, List[str]] = {}
    for key in ("train", "val", "test"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise OptionError(f"--split_file {path}: {key!r} must be a list of case IDs (strings)")
        if len(set(value)) != len(value):
            dup = next(v for v in value if value.count(v) > 1)
            raise OptionError(f"--split_file {path}: case {dup} appears twice in {key!r}")
        lists[key] = list(value)
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = sorted(set(lists[a]) & set(lists[b]))
        if both:
            raise OptionError(f"--split_file {path}: case {both[0]} is in both {a!r} and {b!r}")
    if not any(lists.values()):
        raise OptionError(f"--split_file {path} lists no cases")
    return lists["train"], lists["val"], lists["test"]


def apply_split(plan: ConversionPlan, split_file: Path) -> ConversionPlan:
    """The plan with the lists of ``--split_file``; source cases listed nowhere are left out."""
    train, val, test = read_split_file(split_file)
    unknown = [c for c in train + val + test if c not in plan.cases]
    if unknown:
        raise OptionError(f"--split_file {split_file}: case {unknown[0]} is not in the source {plan.source}"
                          + describe_more(len(unknown) - 1, "unknown cases"))
    notes = list(plan.notes)
    left_out = len(plan.cases) - len(train) - len(val) - len(test)
    if left_out:
        notes.append(f"{left_out} source cases are in none of the --split_file lists and were left out")
    listed = set(train + val + test)
    cases = {c: v for c, v in plan.cases.items() if c in listed}
    return ConversionPlan(plan.spec, plan.source, cases, train, val, test,
                          split_origin=f"--split_file {Path(split_file).resolve()}", notes=notes)


def leave_out_cases(plan: ConversionPlan, case_ids: Iterable[str]) -> ConversionPlan:
    """The plan without ``case_ids``, in its cases and lists; every other case keeps its list."""
    gone = set(case_ids)
    cases = {c: v for c, v in plan.cases.items() if c not in gone}
    return ConversionPlan(plan.spec, plan.source, cases, [c for c in plan.train if c not in gone],
                          [c for c in plan.val if c not in gone], [c for c in plan.test if c not in gone],
                          split_origin=f"{plan.split_origin}; left out for their masks (--skip_ambiguous): "
                                       f"{len(gone)} cases",
                          notes=list(plan.notes), split_problem=plan.split_problem)
