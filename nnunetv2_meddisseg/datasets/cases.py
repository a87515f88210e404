"""What a converter produces: the source cases (:class:`SourceCase`), what the mask rule made of a case's mask
(:class:`MaskFinding`), the kind of dataset (:class:`DatasetSpec`), the split to write (:class:`ConversionPlan`)
and the outcome (:class:`ConversionResult`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["SourceCase", "MaskFinding", "MASK_KINDS", "REFUSED_KINDS", "DatasetSpec", "ConversionPlan",
           "ConversionResult", "BINARY_RGB_CHANNELS"]

BINARY_RGB_CHANNELS: Mapping[str, str] = {"0": "R", "1": "G", "2": "B"}


#: what the rule made of a mask (:attr:`MaskFinding.kind`): a label as it is, faint background values read as
#: background, anti-aliased edges, a JPEG mask, a JPEG of a 0/1 label, middle values thresholded at
#: ``--mask_threshold``, and the refused kinds: a middle value over an area, a mask that would be written empty
#: although it holds non-zero values, a label map of more classes than a binary dataset has
MASK_KINDS = ("label", "faint", "edges", "lossy", "lossy_label", "middle", "ambiguous", "empty", "classes")
#: the kinds a conversion refuses (unless ``--skip_ambiguous``; ``--mask_threshold`` decides the middle values
#: and may move where a mask is cut, never how many classes it holds)
REFUSED_KINDS = ("ambiguous", "empty", "classes")


@dataclass(frozen=True)
class MaskFinding:
    """What the mask rule made of one mask file: its ``kind`` (one of :data:`MASK_KINDS`) and, for the
    refused kinds, ``problem``, a one-line reason naming the file."""

    path: Path
    kind: str
    problem: str = ""

    @property
    def refused(self) -> bool:
        return self.kind in REFUSED_KINDS


@dataclass(frozen=True)
class SourceCase:
    """One case in the source folder.

    ``image`` and ``label`` are the publisher's files; ``extra`` holds further files of the case
    where one case spans several (TransUNet's per-slice ``.npz`` files).
    """

    case_id: str
    image: Path
    label: Path
    extra: Tuple[Path, ...] = ()


@dataclass(frozen=True)
class DatasetSpec:
    """What an nnU-Net dataset of one kind looks like and how to write one case of it.

    ``check_case(case)`` is a cheap validation run on every case before anything is written
    (headers, sizes); ``write_case(case, image_file, label_file, resize)`` writes the converted
    image (``CASE_0000<file_ending>``) and label (``CASE<file_ending>``). Both must be picklable
    (module-level functions or ``functools.partial`` of them): cases are written in worker
    processes. ``inspect_mask(case, threshold)`` (binary 2D datasets; None where the labels are
    instance or organ labels) reads a case's mask by the mask rule and returns its
    :class:`MaskFinding`; where it is set, ``write_case``
    takes the keyword ``mask_threshold`` (``--mask_threshold``).
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
