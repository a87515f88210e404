"""Finding a publisher's files: the layout's root folder, file listings, image / mask pairs."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from .cases import SourceCase
from .errors import ConversionError, MissingSourceError

__all__ = ["existing_source", "find_source_root", "list_files", "pair_images_and_masks", "describe_more"]


def existing_source(source: Path, dataset: str) -> Path:
    """``source`` as a ``Path``; an error where it is not a folder."""
    source = Path(source)
    if not source.is_dir():
        raise MissingSourceError(f"{dataset}: source folder {source} does not exist")
    return source


def find_source_root(source: Path, dataset: str, required: Sequence[str],
                     subfolders: Sequence[str] = ("",)) -> Path:
    """The first ``source / s`` (``s`` in ``subfolders``) holding all ``required`` entries, else an error naming one."""
    source = existing_source(source, dataset)
    roots = [source / sub for sub in subfolders]  # (source / "" is source)
    for root in roots:
        if all((root / r).exists() for r in required):
            return root
    for root in roots:
        if root.is_dir():
            missing = next(r for r in required if not (root / r).exists())
            raise MissingSourceError(f"{dataset}: {root / missing} is missing (expected the publisher's "
                                     f"layout: {', '.join(required)})")
    raise MissingSourceError(f"{dataset}: {source} has none of the expected layouts "
                             f"({', '.join(required)} inside {source} or {', '.join(s for s in subfolders if s)})")


def list_files(folder: Path, suffixes: Sequence[str], exclude: Optional[str] = None) -> List[Path]:
    """Sorted plain files with a suffix in ``suffixes`` (any case), minus hidden ones and regex ``exclude`` matches."""
    suffixes = tuple(s.lower() for s in suffixes)
    pattern = re.compile(exclude) if exclude else None
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
             and p.suffix.lower() in suffixes and not (pattern and pattern.search(p.name))]
    return sorted(files, key=lambda p: p.name)


def _by_case_id(files: Iterable[Path], tag: str, what: str) -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for p in files:
        if not p.stem.lower().endswith(tag.lower()):
            continue
        stem = p.stem[: len(p.stem) - len(tag)]
        if stem in found:
            raise ConversionError(f"two {what} files for case {stem}: {found[stem]} and {p}")
        found[stem] = p
    return found


def _expected_file(folder: Path, stem: str, suffixes: Sequence[str], other: Path) -> str:
    """``folder / stem`` with ``other``'s ending if in ``suffixes`` (else the first), and the other endings taken."""
    ending = next((s for s in suffixes if s.lower() == other.suffix.lower()), suffixes[0])
    others = [s for s in suffixes if s.lower() != ending.lower()]
    return f"{folder / (stem + ending)}" + (f", or {stem}{'/'.join(others)}" if others else "")


def describe_more(n: int, what: str) -> str:
    return f" ({n} more {what})" if n > 0 else ""


def pair_images_and_masks(image_dir: Path, mask_dir: Path, dataset: str,
                          image_suffixes: Sequence[str], mask_suffixes: Sequence[str],
                          mask_tag: str = "", image_exclude: Optional[str] = None,
                          image_ids: Optional[Mapping[str, Path]] = None) -> Dict[str, SourceCase]:
    """Cases ``{case_id: SourceCase}``: image ``ID.<image suffix>`` pairs with mask ``ID<mask_tag>.<mask suffix>``.

    Unpaired files are errors. ``image_ids`` replaces the listing of ``image_dir`` (images and masks in one folder).
    """
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise MissingSourceError(f"{dataset}: folder {folder} does not exist")
    if image_ids is None:
        images = _by_case_id(list_files(image_dir, image_suffixes, image_exclude), "", "image")
    else:
        images = dict(image_ids)
    if not images:
        raise ConversionError(f"{dataset}: no images ({'/'.join(image_suffixes)}) found in {image_dir}")
    masks = _by_case_id(list_files(mask_dir, mask_suffixes), mask_tag, "mask")
    if not masks:
        raise ConversionError(f"{dataset}: no masks (*{mask_tag}{'/'.join(mask_suffixes)}) found in {mask_dir}")
    no_mask = [c for c in images if c not in masks]
    if no_mask:
        image = images[no_mask[0]]
        expected = _expected_file(mask_dir, f"{no_mask[0]}{mask_tag}", mask_suffixes, image)
        raise ConversionError(f"{dataset}: image {image} has no mask (expected {expected})"
                              + describe_more(len(no_mask) - 1, "images without a mask"))
    no_image = [c for c in masks if c not in images]
    if no_image:
        mask = masks[no_image[0]]
        expected = _expected_file(image_dir, no_image[0], image_suffixes, mask)
        raise ConversionError(f"{dataset}: mask {mask} has no image (expected {expected})"
                              + describe_more(len(no_image) - 1, "masks without an image"))
    return {c: SourceCase(c, images[c], masks[c]) for c in sorted(images)}
