"""Shared machinery of the dataset converters: finding and pairing source files, reading images
and masks, split lists, and writing an nnU-Net v2 raw dataset atomically.

A converter module (``kvasir``, ``glas``, ...) turns a publisher's folder into a
:class:`ConversionPlan` (which cases exist, how to write one, which are train / val / test);
:func:`write_nnunet_dataset` then writes ``$nnUNet_raw/DatasetXXX_Name/`` (``imagesTr``,
``labelsTr``, ``imagesTs``, ``labelsTs``, ``dataset.json``) into a hidden
``.DatasetXXX_Name.partial`` sibling and renames it into place only once every case was written,
so an interrupted or failed conversion never leaves a valid-looking dataset behind. The
train / val split goes to ``splits_final.json`` (fold 0) both in the raw folder (nnU-Net's
planner copies it from there) and, when ``nnUNet_preprocessed`` is set, straight into
``$nnUNet_preprocessed/DatasetXXX_Name/``, where ``nnUNetv2_train ID 2d 0`` reads it.

Every user mistake raises :class:`ConversionError` with a one-line message that names the file or
option and says what was expected.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

__all__ = [
    "ConversionError",
    "OptionError",
    "MissingSourceError",
    "SourceCase",
    "DatasetSpec",
    "ConversionPlan",
    "ConversionResult",
    "BINARY_RGB_CHANNELS",
    "SPLIT_SEED",
    "LOSSY_SUFFIXES",
    "validate_resize",
    "validate_dataset_id",
    "require_env_folder",
    "find_source_root",
    "list_files",
    "pair_images_and_masks",
    "image_size",
    "read_rgb",
    "read_binary_mask",
    "read_instance_mask_as_binary",
    "check_2d_sizes",
    "write_binary_2d_case",
    "make_seeded_split",
    "holdout_count",
    "load_shipped_split",
    "plan_from_shipped_split",
    "read_split_file",
    "apply_split",
    "write_nnunet_dataset",
]

BINARY_RGB_CHANNELS: Mapping[str, str] = {"0": "R", "1": "G", "2": "B"}
SPLIT_SEED = 12345  # seed of every split drawn here (the shipped Kvasir lists and run-time hold-outs)
LOSSY_SUFFIXES = (".jpg", ".jpeg")
_ENV_HINT = "see nnU-Net's documentation/setting_up_paths.md"


class ConversionError(ValueError):
    """A problem with the user's options or source files; ``str(err)`` is one line naming the
    file or option and what was expected."""

    exit_code = 1


class OptionError(ConversionError):
    """A bad command-line option (``--resize 0``, a bad ``-d``, a bad ``--split-file``)."""

    exit_code = 2


class MissingSourceError(ConversionError, FileNotFoundError):
    """A source folder or file that the publisher's layout requires is missing."""


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
    processes.
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
    split_problem: Optional[str] = None  # why the default split cannot be used (fine with --split-file)


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


# ----------------------------------------------------------------------------------------------
# options and environment


def validate_resize(resize: Optional[int]) -> None:
    """``None`` (keep the original size) or a positive number of pixels."""
    if resize is None:
        return
    if isinstance(resize, bool) or not isinstance(resize, (int, np.integer)) or resize <= 0:
        raise OptionError(f"--resize must be a positive number of pixels (N gives NxN), got {resize!r}")


def validate_dataset_id(dataset_id: int) -> None:
    """nnU-Net dataset IDs are integers 1..999 (written with three digits)."""
    if isinstance(dataset_id, bool) or not isinstance(dataset_id, (int, np.integer)) or not 1 <= dataset_id <= 999:
        raise OptionError(f"-d must be a dataset ID between 1 and 999, got {dataset_id!r}")


def require_env_folder(env_var: str) -> Path:
    """The folder named by an nnU-Net environment variable (created if missing)."""
    value = os.environ.get(env_var)
    if not value:
        raise OptionError(f"environment variable {env_var} is not set: point it to nnU-Net's "
                          f"{env_var[7:]} data folder ({_ENV_HINT})")
    folder = Path(value)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OptionError(f"{env_var}={value} cannot be used as a folder: {err.strerror or err}") from None
    return folder


def _optional_env_folder(env_var: str) -> Optional[Path]:
    value = os.environ.get(env_var)
    return Path(value) if value else None


# ----------------------------------------------------------------------------------------------
# finding files


def find_source_root(source: Path, dataset: str, required: Sequence[str],
                     subfolders: Sequence[str] = ("",)) -> Path:
    """The folder among ``source / s`` (``s`` in ``subfolders``) that contains all ``required``
    entries; a clear error naming the first missing one otherwise."""
    source = Path(source)
    if not source.is_dir():
        raise MissingSourceError(f"{dataset}: source folder {source} does not exist")
    for sub in subfolders:
        root = source / sub if sub else source
        if all((root / r).exists() for r in required):
            return root
    for sub in subfolders:
        root = source / sub if sub else source
        if root.is_dir():
            missing = next(r for r in required if not (root / r).exists())
            raise MissingSourceError(f"{dataset}: {root / missing} is missing (expected the publisher's "
                                     f"layout: {', '.join(required)})")
    raise MissingSourceError(f"{dataset}: {source} has none of the expected layouts "
                             f"({', '.join(required)} inside {source} or {', '.join(s for s in subfolders if s)})")


def list_files(folder: Path, suffixes: Sequence[str], exclude: Optional[str] = None) -> List[Path]:
    """Plain files of ``folder`` whose suffix (case-insensitive) is in ``suffixes``, hidden files
    and names matching the regular expression ``exclude`` left out, sorted by name."""
    suffixes = tuple(s.lower() for s in suffixes)
    pattern = re.compile(exclude) if exclude else None
    files = []
    for p in folder.iterdir():
        if not p.is_file() or p.name.startswith(".") or p.suffix.lower() not in suffixes:
            continue
        if pattern is not None and pattern.search(p.name):
            continue
        files.append(p)
    return sorted(files, key=lambda p: p.name)


def _by_case_id(files: Iterable[Path], tag: str, what: str) -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for p in files:
        stem = p.stem
        if tag:
            if not stem.lower().endswith(tag.lower()):
                continue
            stem = stem[: len(stem) - len(tag)]
        if stem in found:
            raise ConversionError(f"two {what} files for case {stem}: {found[stem]} and {p}")
        found[stem] = p
    return found


def _describe_more(n: int, what: str) -> str:
    return f" ({n} more {what})" if n > 0 else ""


def pair_images_and_masks(image_dir: Path, mask_dir: Path, dataset: str,
                          image_suffixes: Sequence[str], mask_suffixes: Sequence[str],
                          mask_tag: str = "", image_exclude: Optional[str] = None,
                          image_ids: Optional[Mapping[str, Path]] = None) -> Dict[str, SourceCase]:
    """Cases ``{case_id: SourceCase}`` from an image folder and a mask folder.

    An image ``ID.<image suffix>`` pairs with the mask ``ID<mask_tag>.<mask suffix>``. Images
    without a mask, masks without an image, and empty folders are errors naming the file.
    ``image_ids`` replaces the listing of ``image_dir`` (layouts with images and masks in one
    folder).
    """
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise MissingSourceError(f"{dataset}: folder {folder} does not exist")
    if image_ids is None:
        image_files = list_files(image_dir, image_suffixes, image_exclude)
        images = _by_case_id(image_files, "", "image")
    else:
        images = dict(image_ids)
    if not images:
        raise ConversionError(f"{dataset}: no images ({'/'.join(image_suffixes)}) found in {image_dir}")
    masks = _by_case_id(list_files(mask_dir, mask_suffixes), mask_tag, "mask")
    if not masks:
        raise ConversionError(f"{dataset}: no masks (*{mask_tag}{'/'.join(mask_suffixes)}) found in {mask_dir}")
    no_mask = [c for c in images if c not in masks]
    if no_mask:
        expected = mask_dir / f"{no_mask[0]}{mask_tag}{mask_suffixes[0]}"
        raise ConversionError(f"{dataset}: image {images[no_mask[0]]} has no mask (expected {expected})"
                              + _describe_more(len(no_mask) - 1, "images without a mask"))
    no_image = [c for c in masks if c not in images]
    if no_image:
        raise ConversionError(f"{dataset}: mask {masks[no_image[0]]} has no image (expected "
                              f"{image_dir / (no_image[0] + image_suffixes[0])})"
                              + _describe_more(len(no_image) - 1, "masks without an image"))
    return {c: SourceCase(c, images[c], masks[c]) for c in sorted(images)}


# ----------------------------------------------------------------------------------------------
# reading and writing 2D images


def _open(path: Path) -> Image.Image:
    try:
        img = Image.open(path)
    except FileNotFoundError:
        raise MissingSourceError(f"{path} does not exist") from None
    except Exception as err:  # PIL raises many kinds for unreadable files
        raise ConversionError(f"cannot read image {path}: {_short(err)}") from None
    return img


def _load(img: Image.Image, path: Path) -> Image.Image:
    try:
        img.load()
    except Exception as err:
        raise ConversionError(f"cannot read image {path} (corrupt or truncated?): {_short(err)}") from None
    return img


def _short(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def image_size(path: Path) -> Tuple[int, int]:
    """``(width, height)`` from the file header (cheap: no decoding)."""
    with _open(path) as img:
        return img.size


def read_rgb(path: Path) -> Image.Image:
    """The image as a decoded 8-bit RGB ``PIL.Image`` (grey, palette and RGBA converted)."""
    img = _load(_open(path), path)
    return img if img.mode == "RGB" else img.convert("RGB")


def _grey_array(img: Image.Image) -> Tuple[np.ndarray, int]:
    """Single-channel array of a mask and its full range: 255, or 65535 for 16-bit and integer
    masks whose values go above 255 (8-bit values stored in a 16-bit file keep 255)."""
    if img.mode.startswith("I") or img.mode == "F":
        arr = np.asarray(img).astype(np.float64)
        return arr, 65535 if arr.max(initial=0) > 255 else 255
    if img.mode == "1":
        return np.asarray(img).astype(np.uint8) * 255, 255
    if img.mode != "L":
        img = img.convert("L")
    return np.asarray(img), 255


def read_binary_mask(path: Path, lossy: Optional[bool] = None) -> np.ndarray:
    """A binary mask as ``(H, W)`` uint8 in {0, 1}.

    Colour masks are converted to grey first. JPEG masks (``lossy``, by default decided by the
    file suffix) are thresholded at half their range (> 127 for 8 bit): their edges and
    background are noisy. Lossless masks already holding only {0, 1} (also as palette indices)
    are kept as labels; any other lossless mask is thresholded at half its range too (0/255
    masks, anti-aliased edges).
    """
    path = Path(path)
    if lossy is None:
        lossy = path.suffix.lower() in LOSSY_SUFFIXES
    img = _load(_open(path), path)
    if img.mode == "P":  # palette masks: the indices are the labels when they are 0/1
        indices = np.asarray(img)
        if indices.max(initial=0) <= 1:
            return indices.astype(np.uint8)
    arr, full = _grey_array(img)
    if not lossy and arr.max(initial=0) <= 1 and arr.min(initial=0) >= 0:
        return arr.astype(np.uint8)
    return (arr > full / 2).astype(np.uint8)


def read_instance_mask_as_binary(path: Path) -> np.ndarray:
    """An instance-label mask (0 background, 1..K objects) as binary ``(H, W)`` uint8."""
    img = _load(_open(path), path)
    arr = np.asarray(img)
    if arr.ndim == 3:
        arr = arr.max(axis=-1)
    return (arr > 0).astype(np.uint8)


def check_2d_sizes(case: SourceCase) -> None:
    """Image and mask headers are readable and give the same width and height."""
    image, mask = image_size(case.image), image_size(case.label)
    if image != mask:
        raise ConversionError(f"mask {case.label} is {mask[0]}x{mask[1]} but image {case.image} is "
                              f"{image[0]}x{image[1]} (expected the same size)")


def write_binary_2d_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int],
                         instance_mask: bool = False) -> None:
    """Write an RGB PNG image and a {0, 1} label PNG, optionally resized to ``resize x resize``
    (image bilinear, mask nearest neighbour after binarisation)."""
    image = read_rgb(case.image)
    mask = read_instance_mask_as_binary(case.label) if instance_mask else read_binary_mask(case.label)
    if image.size != (mask.shape[1], mask.shape[0]):
        raise ConversionError(f"mask {case.label} is {mask.shape[1]}x{mask.shape[0]} but image {case.image} "
                              f"is {image.size[0]}x{image.size[1]} (expected the same size)")
    mask_img = Image.fromarray(mask, mode="L")
    if resize is not None:
        image = image.resize((resize, resize), Image.Resampling.BILINEAR)
        mask_img = mask_img.resize((resize, resize), Image.Resampling.NEAREST)
    image.save(image_file, format="PNG")
    mask_img.save(label_file, format="PNG")


# ----------------------------------------------------------------------------------------------
# splits


def make_seeded_split(case_ids: Iterable[str], n_val: int, n_test: int,
                      seed: int = SPLIT_SEED) -> Tuple[List[str], List[str], List[str]]:
    """A reproducible train / val / test split: the sorted IDs are permuted with
    ``numpy.random.RandomState(seed)`` (a stream numpy keeps stable across versions); the first
    ``n_test`` are test, the next ``n_val`` val, the rest train. Each list is returned sorted."""
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
    """A plan using a shipped split; unless the source holds exactly the shipped case IDs, the plan
    carries a ``split_problem`` (an error unless ``--split-file`` replaces the split)."""
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
                   f"{'; '.join(parts)}; pass your own lists with --split-file")
        return ConversionPlan(spec, source, cases, [], [], [], split_origin="", split_problem=problem)
    return ConversionPlan(spec, source, cases, list(shipped["train"]), list(shipped["val"]), list(shipped["test"]),
                          split_origin=f"shipped splits/{filename}: {shipped.get('description', '')}".strip())


def read_split_file(path: Path) -> Tuple[List[str], List[str], List[str]]:
    """``--split-file``: a JSON object with lists of case IDs under ``train``, ``val``, ``test``
    (``val`` and ``test`` may be left out)."""
    path = Path(path)
    if not path.is_file():
        raise OptionError(f"--split-file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OptionError(f"--split-file {path} is not valid JSON: {_short(err)}") from None
    if not isinstance(data, dict):
        raise OptionError(f"--split-file {path} must hold a JSON object with lists 'train', 'val', 'test'")
    unknown = sorted(set(data) - {"train", "val", "test", "description"})
    if unknown:
        raise OptionError(f"--split-file {path} has unknown key {unknown[0]!r} (expected train, val, test)")
    lists = []
    for key in ("train", "val", "test"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise OptionError(f"--split-file {path}: {key!r} must be a list of case IDs (strings)")
        if len(set(value)) != len(value):
            dup = next(v for v in value if value.count(v) > 1)
            raise OptionError(f"--split-file {path}: case {dup} appears twice in {key!r}")
        lists.append(list(value))
    train, val, test = lists
    named = {"train": train, "val": val, "test": test}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = sorted(set(named[a]) & set(named[b]))
        if both:
            raise OptionError(f"--split-file {path}: case {both[0]} is in both {a!r} and {b!r}")
    if not (train or val or test):
        raise OptionError(f"--split-file {path} lists no cases")
    return train, val, test


def apply_split(plan: ConversionPlan, split_file: Path) -> ConversionPlan:
    """The plan with the lists of ``--split-file``; source cases listed nowhere are left out."""
    train, val, test = read_split_file(split_file)
    unknown = [c for c in train + val + test if c not in plan.cases]
    if unknown:
        raise OptionError(f"--split-file {split_file}: case {unknown[0]} is not in the source {plan.source}"
                          + _describe_more(len(unknown) - 1, "unknown cases"))
    notes = [n for n in plan.notes]
    left_out = len(plan.cases) - len(train) - len(val) - len(test)
    if left_out:
        notes.append(f"{left_out} source cases are in none of the --split-file lists and were left out")
    listed = set(train + val + test)
    cases = {c: v for c, v in plan.cases.items() if c in listed}
    return ConversionPlan(plan.spec, plan.source, cases, train, val, test,
                          split_origin=f"--split-file {Path(split_file).resolve()}", notes=notes)


# ----------------------------------------------------------------------------------------------
# writing the dataset


def _existing_with_id(root: Optional[Path], dataset_id: int) -> List[Path]:
    if root is None or not root.is_dir():
        return []
    prefix = f"Dataset{dataset_id:03d}_"
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(prefix))


def _splits_final(train: Sequence[str], val: Sequence[str]) -> List[dict]:
    return [{"train": sorted(train), "val": sorted(val)}]


def _write_json_atomic(data, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_one(write_case: Callable, case: SourceCase, image_file: Path, label_file: Path,
               resize: Optional[int]) -> str:
    write_case(case, image_file, label_file, resize)
    return case.case_id


def write_nnunet_dataset(plan: ConversionPlan, dataset_id: int, resize: Optional[int] = None,
                         overwrite: bool = False, num_processes: int = 1,
                         progress: bool = False) -> ConversionResult:
    """Write the plan as ``$nnUNet_raw/DatasetXXX_<spec.name>`` (see the module docstring).

    Train and val cases go to imagesTr/labelsTr, test cases to imagesTs/labelsTs. An existing
    dataset with this ID is refused unless ``overwrite`` (and even then when it has another
    name: nnU-Net needs IDs to be unique). ``num_processes`` > 1 writes cases in parallel.
    """
    from nnunetv2.dataset_conversion.generate_dataset_json import generate_dataset_json

    validate_dataset_id(dataset_id)
    validate_resize(resize)
    spec = plan.spec
    raw_root = require_env_folder("nnUNet_raw")
    prep_root = _optional_env_folder("nnUNet_preprocessed")
    name = f"Dataset{dataset_id:03d}_{spec.name}"
    target = raw_root / name
    notes = list(plan.notes)

    for root in (raw_root, prep_root, _optional_env_folder("nnUNet_results")):
        for other in _existing_with_id(root, dataset_id):
            if other.name != name:
                raise ConversionError(f"dataset ID {dataset_id} is already used by {other}: nnU-Net needs unique "
                                      f"IDs, choose another -d or remove that folder")
    if target.exists() and not overwrite:
        raise ConversionError(f"{target} already exists: pass --overwrite to replace it or choose another -d")

    if plan.split_problem:
        raise ConversionError(plan.split_problem)
    if not plan.train and not plan.val and not plan.test:
        raise ConversionError(f"{spec.name}: no cases to convert in {plan.source}")
    splits = _splits_final(plan.train, plan.val) if plan.train and plan.val else None
    prep_splits = prep_root / name / "splits_final.json" if prep_root is not None else None
    if splits is not None and prep_splits is not None and prep_splits.is_file() and not overwrite:
        try:
            same = json.loads(prep_splits.read_text(encoding="utf-8"))[:1] == splits
        except (OSError, ValueError):
            same = False
        if not same:
            raise ConversionError(f"{prep_splits} already exists with a different split: pass --overwrite "
                                  f"to replace it")
    stale_splits = splits is None and prep_splits is not None and prep_splits.is_file()
    if stale_splits and not overwrite:
        raise ConversionError(f"{prep_splits} already exists but this conversion has no validation set: pass "
                              f"--overwrite to remove it")

    subsets = [(c, "Tr") for c in plan.train + plan.val] + [(c, "Ts") for c in plan.test]
    for case_id, _ in subsets:
        spec.check_case(plan.cases[case_id])

    partial_dir = raw_root / f".{name}.partial"
    if partial_dir.exists():
        shutil.rmtree(partial_dir)
    try:
        for sub in ("imagesTr", "labelsTr", "imagesTs", "labelsTs"):
            (partial_dir / sub).mkdir(parents=True)
        jobs = [(plan.cases[c], partial_dir / f"images{s}" / f"{c}_0000{spec.file_ending}",
                 partial_dir / f"labels{s}" / f"{c}{spec.file_ending}") for c, s in subsets]
        _run_jobs(spec.write_case, jobs, resize, num_processes, progress, name)
        generate_dataset_json(
            str(partial_dir), dict(spec.channel_names), dict(spec.labels),
            num_training_cases=len(plan.train) + len(plan.val), file_ending=spec.file_ending,
            dataset_name=name, reference=spec.reference or None, description=spec.description or None,
            license=spec.licence, converted_by="nnunetv2_meddisseg_convert",
            numTest=len(plan.test),
            meddisseg_conversion={"source": str(Path(plan.source).resolve()), "resize": resize,
                                  "split": plan.split_origin, "num_train": len(plan.train),
                                  "num_val": len(plan.val), "num_test": len(plan.test)},
        )
        if splits is not None:
            _write_json_atomic(splits, partial_dir / "splits_final.json")
        _move_into_place(partial_dir, target, raw_root / f".{name}.old")
    except BaseException:
        shutil.rmtree(partial_dir, ignore_errors=True)
        raise

    written = [target / "splits_final.json"] if splits is not None else []
    if splits is not None and prep_splits is not None:
        if prep_splits.parent.is_dir() and any(p.name != "splits_final.json" for p in prep_splits.parent.iterdir()):
            notes.append(f"{prep_splits.parent} holds preprocessed data of an earlier conversion: rerun "
                         f"nnUNetv2_plan_and_preprocess -d {dataset_id} --clean")
        prep_splits.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(splits, prep_splits)
        written.append(prep_splits)
    elif stale_splits:
        prep_splits.unlink()
        notes.append(f"removed {prep_splits} of an earlier conversion (this one has no validation set)")
    if splits is not None and prep_splits is None:
        notes.append("nnUNet_preprocessed is not set: splits_final.json was written to the raw folder only; "
                     "nnUNetv2_plan_and_preprocess copies it next to the preprocessed data")
    if splits is None and (plan.train or plan.val):
        notes.append("no validation cases: no splits_final.json was written, nnU-Net will draw its own "
                     "5-fold cross-validation")
    return ConversionResult(name, target, written, len(plan.train), len(plan.val), len(plan.test), notes)


def _run_jobs(write_case: Callable, jobs: List[tuple], resize: Optional[int], num_processes: int,
              progress: bool, desc: str) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc=desc, unit="case", disable=not progress)
    try:
        if num_processes <= 1 or len(jobs) < 2:
            for case, img, lbl in jobs:
                _write_one(write_case, case, img, lbl, resize)
                bar.update()
            return
        with ProcessPoolExecutor(max_workers=min(num_processes, len(jobs)), mp_context=get_context("spawn")) as ex:
            fn = partial(_write_one, write_case, resize=resize)
            futures = [ex.submit(fn, case, img, lbl) for case, img, lbl in jobs]
            try:
                for fut in futures:
                    fut.result()
                    bar.update()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
    finally:
        bar.close()


def _move_into_place(partial_dir: Path, target: Path, old: Path) -> None:
    if not target.exists():
        os.replace(partial_dir, target)
        return
    if old.exists():
        shutil.rmtree(old)
    os.replace(target, old)
    try:
        os.replace(partial_dir, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
