"""What a converter produces: source cases, mask findings, the dataset kind, the split to write and the outcome."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["SourceCase", "MaskFinding", "MASK_KINDS", "REFUSED_KINDS", "DatasetSpec", "ConversionPlan",
           "ConversionResult", "BINARY_RGB_CHANNELS"]

BINARY_RGB_CHANNELS: Mapping[str, str] = {"0": "R", "1": "G", "2": "B"}


#: the rule's verdicts (``MaskFinding.kind``): plain label, faint background, anti-aliased edges, JPEG, JPEG 0/1 label,
#: middle values cut at ``--mask_threshold``; refused: middle value over an area, non-zero mask left empty, label map
MASK_KINDS = ("label", "faint", "edges", "lossy", "lossy_label", "middle", "ambiguous", "empty", "classes")
#: the kinds a conversion refuses unless ``--skip_ambiguous``; ``--mask_threshold`` settles middle values, never classes
REFUSED_KINDS = ("ambiguous", "empty", "classes")


@dataclass(frozen=True)
class MaskFinding:
    """One mask's ``kind`` (of ``MASK_KINDS``) and, if refused, ``problem``: a one-line reason naming the file."""

    path: Path
    kind: str
    problem: str = ""

    @property
    def refused(self) -> bool:
        return self.kind in REFUSED_KINDS


@dataclass(frozen=True)
class SourceCase:
    """One source case; ``extra`` holds its further files where it spans several (TransUNet's per-slice ``.npz``)."""

    case_id: str
    image: Path
    label: Path
    extra: Tuple[Path, ...] = ()


@dataclass(frozen=True)
class DatasetSpec:
    """One kind of nnU-Net dataset and how to write one case of it.

    ``check_case`` cheaply checks every case (headers, sizes) before writing; it and ``write_case`` must be picklable
    (module-level functions or their ``partial``) for worker processes. ``inspect_mask`` returns the mask rule's
    ``MaskFinding`` (None for instance or organ labels); where set, ``write_case`` takes ``mask_threshold``.
    """

    name: str
    channel_names: Mapping[str, str]
    labels: Mapping[str, int]
    file_ending: str
    check_case: Callable[[SourceCase], None]
    write_case: Callable[[SourceCase, Path, Path, Optional[int]], None]
    reference: str = ""
    licence: str = "see the dataset publisher"
    description: str = ""
    inspect_mask: Optional[Callable[[SourceCase, Optional[float]], MaskFinding]] = None


@dataclass
class ConversionPlan:
    """The cases of a source folder and the split to write (lists of case IDs)."""

    spec: DatasetSpec
    source: Path
    cases: Dict[str, SourceCase]
    train: List[str]
    val: List[str]
    test: List[str]
    split_origin: str
    notes: List[str] = field(default_factory=list)
    split_problem: Optional[str] = None  # why the default split cannot be used (fine with --split_file)


@dataclass
class ConversionResult:
    """Where the dataset went and what it holds."""

    dataset_name: str
    raw_folder: Path
    splits_files: List[Path]
    num_train: int
    num_val: int
    num_test: int
    notes: List[str]
    mask_report: List[str] = field(default_factory=list)  # the lines of the mask report (none for labels)
