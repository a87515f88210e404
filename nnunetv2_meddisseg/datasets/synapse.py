"""Synapse multi-organ CT (MICCAI 2015 "Beyond the Cranial Vault", BTCV) in the TransUNet protocol.

- BTCV: ``RawData/Training/img/img0001.nii.gz`` and ``label/label0001.nii.gz`` (SRC: ``RawData``, its parent or
  ``RawData/Training``; the unlabelled ``RawData/Testing`` is ignored). The 13 labels map to TransUNet's 8 organs
  (``BTCV_TO_TRANSUNET``), the rest to background; a label outside 0..13 is an error.
- TransUNet's release: ``train_npz/case0005_slice000.npz`` (axial slices, stacked in order) and
  ``test_vol_h5/case0001.npy.h5`` (volumes; needs h5py). Labels 0..8, intensities clipped to [-125, 275] HU and
  scaled to [0, 1]; no geometry, so 1 mm spacing.

Volumes stay 3D (``.nii.gz``) so nnU-Net's ``2d`` configuration trains slice by slice, as TransUNet does. Cases are
named as TransUNet's (``case0001`` for ``img0001``). Split: TransUNet's ``lists/lists_Synapse``, 18 training and 12
test volumes; fold-0 validation is a seeded 10 % of training (2, seed 12345), so fold 0 trains on 16.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import SimpleITK as sitk

from .cases import ConversionPlan, DatasetSpec, SourceCase
from .errors import ConversionError, MissingSourceError
from .source_files import existing_source
from .split_lists import SPLIT_SEED, holdout_count, make_seeded_split

__all__ = [
    "TRANSUNET_TRAIN_CASES",
    "TRANSUNET_TEST_CASES",
    "BTCV_TO_TRANSUNET",
    "SYNAPSE_LABELS",
    "SYNAPSE_SPEC",
    "SYNAPSE_TRANSUNET_SPEC",
    "plan_synapse",
    "resize_in_plane",
]

TRANSUNET_TRAIN_CASES: Tuple[str, ...] = tuple(f"case{i:04d}" for i in (
    5, 6, 7, 9, 10, 21, 23, 24, 26, 27, 28, 30, 31, 33, 34, 37, 39, 40))
TRANSUNET_TEST_CASES: Tuple[str, ...] = tuple(f"case{i:04d}" for i in (
    8, 22, 38, 36, 32, 2, 29, 3, 1, 4, 25, 35))

# BTCV label -> TransUNet label. BTCV: 1 spleen, 2 right kidney, 3 left kidney, 4 gallbladder, 5 oesophagus, 6 liver,
# 7 stomach, 8 aorta, 9 inferior vena cava, 10 portal and splenic vein, 11 pancreas, 12/13 right/left adrenal gland.
BTCV_TO_TRANSUNET: Dict[int, int] = {8: 1, 4: 2, 3: 3, 2: 4, 6: 5, 11: 6, 1: 7, 7: 8}
SYNAPSE_LABELS: Dict[str, int] = {"background": 0, "aorta": 1, "gallbladder": 2, "left kidney": 3,
                                  "right kidney": 4, "liver": 5, "pancreas": 6, "spleen": 7, "stomach": 8}
_BTCV_MAX = 13
_LUT = np.zeros(_BTCV_MAX + 1, dtype=np.uint8)
_LUT[list(BTCV_TO_TRANSUNET)] = list(BTCV_TO_TRANSUNET.values())

_NPZ = re.compile(r"(case\d+)_slice(\d+)\.npz")
_H5 = re.compile(r"(case\d+)\.npy\.h5")


# ----------------------------------------------------------------------------------------------
# reading and writing volumes


def _read_volume(path: Path) -> sitk.Image:
    try:
        return sitk.ReadImage(str(path))
    except Exception as err:
        raise ConversionError(f"cannot read volume {path}: {' '.join(str(err).split())[:200]}") from None


def _volume_size(path: Path) -> Tuple[int, ...]:
    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except Exception as err:
        raise ConversionError(f"cannot read volume {path}: {' '.join(str(err).split())[:200]}") from None
    return tuple(reader.GetSize())


def _check_labels(arr: np.ndarray, path: Path, max_label: int, what: str) -> np.ndarray:
    values = np.unique(arr)
    bad = [v for v in values if v < 0 or v > max_label or v != np.round(v)]
    if bad:
        shown = ", ".join(f"{v:g}" for v in bad[:5])
        raise ConversionError(f"label {path} holds values {shown} that are not {what} (0..{max_label})")
    return arr.astype(np.int64)


def resize_in_plane(image: sitk.Image, size: int, is_label: bool) -> sitk.Image:
    """Resample each axial slice to ``size x size`` (label nearest, image linear); spacing scales to keep the extent."""
    old_size, old_spacing = image.GetSize(), image.GetSpacing()
    new_size = (size, size) + tuple(old_size[2:])
    new_spacing = tuple(sp * n / m for sp, n, m in zip(old_spacing[:2], old_size[:2], new_size[:2])) \
        + tuple(old_spacing[2:])
    direction = np.array(image.GetDirection()).reshape(image.GetDimension(), image.GetDimension())
    shift = np.zeros(image.GetDimension())
    shift[:2] = (np.array(new_spacing[:2]) - np.array(old_spacing[:2])) / 2
    origin = np.array(image.GetOrigin()) + direction @ shift
    interpolator = sitk.sitkNearestNeighbor if is_label else sitk.sitkLinear
    return sitk.Resample(image, [int(s) for s in new_size], sitk.Transform(), interpolator, origin.tolist(),
                         new_spacing, image.GetDirection(), 0.0, image.GetPixelID())


def _write_pair(image: sitk.Image, label: sitk.Image, image_file: Path, label_file: Path,
                resize: Optional[int]) -> None:
    if resize is not None:
        image, label = resize_in_plane(image, resize, False), resize_in_plane(label, resize, True)
    sitk.WriteImage(image, str(image_file), True)
    sitk.WriteImage(label, str(label_file), True)


def check_btcv_case(case: SourceCase) -> None:
    """Both volumes readable (header only), 3D, of the same size."""
    image, label = _volume_size(case.image), _volume_size(case.label)
    if len(image) != 3:
        raise ConversionError(f"volume {case.image} has {len(image)} dimensions (expected a 3D CT volume)")
    if image != label:
        raise ConversionError(f"label {case.label} is {'x'.join(map(str, label))} but image {case.image} is "
                              f"{'x'.join(map(str, image))} (expected the same size)")


def write_btcv_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int]) -> None:
    """One BTCV volume with its 13 labels mapped to TransUNet's 8 organs (sizes checked by ``check_btcv_case``)."""
    image, label = _read_volume(case.image), _read_volume(case.label)
    values = _check_labels(sitk.GetArrayFromImage(label), case.label, _BTCV_MAX, "BTCV labels")
    mapped = sitk.GetImageFromArray(_LUT[values])
    mapped.CopyInformation(image)
    _write_pair(image, mapped, image_file, label_file, resize)


def _no_check(case: SourceCase) -> None:
    """TransUNet's files have no cheap header: they are checked while they are written."""


def _load_npz_slices(files: Tuple[Path, ...]) -> Tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for f in files:
        try:
            with np.load(f) as data:
                image, label = np.asarray(data["image"]), np.asarray(data["label"])
        except KeyError:
            raise ConversionError(f"slice {f} lacks the arrays 'image' and 'label' of TransUNet's npz files") from None
        except Exception as err:
            raise ConversionError(f"cannot read slice {f}: {' '.join(str(err).split())[:200]}") from None
        if image.ndim != 2 or image.shape != label.shape:
            raise ConversionError(f"slice {f} has image {image.shape} and label {label.shape} (expected two equal "
                                  f"2D shapes)")
        if images and image.shape != images[0].shape:
            raise ConversionError(f"slice {f} is {image.shape} but slice {files[0]} is {images[0].shape} "
                                  f"(expected one size per case)")
        images.append(image)
        labels.append(label)
    return np.stack(images), np.stack(labels)


def _load_h5(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    h5py = _require_h5py(path)
    try:
        with h5py.File(path, "r") as f:
            image, label = np.asarray(f["image"]), np.asarray(f["label"])
    except KeyError:
        raise ConversionError(f"volume {path} lacks the datasets 'image' and 'label' of TransUNet's h5 files") from None
    except Exception as err:
        raise ConversionError(f"cannot read volume {path}: {' '.join(str(err).split())[:200]}") from None
    if image.ndim != 3 or image.shape != label.shape:
        raise ConversionError(f"volume {path} has image {image.shape} and label {label.shape} (expected two equal "
                              f"3D shapes)")
    return image, label


def write_transunet_case(case: SourceCase, image_file: Path, label_file: Path, resize: Optional[int]) -> None:
    """One case of TransUNet's release: stacked npz slices or an h5 volume, (D, H, W), 1 mm spacing."""
    if case.extra:
        image, label = _load_npz_slices(case.extra)
        label_source = case.extra[0].parent / f"{case.case_id}_slice*.npz"
    else:
        image, label = _load_h5(case.image)
        label_source = case.image
    values = _check_labels(label, label_source, len(SYNAPSE_LABELS) - 1, "TransUNet's organ labels")
    itk_image = sitk.GetImageFromArray(image.astype(np.float32))
    itk_label = sitk.GetImageFromArray(values.astype(np.uint8))
    itk_label.CopyInformation(itk_image)
    _write_pair(itk_image, itk_label, image_file, label_file, resize)


_REFERENCE = ("Landman et al., MICCAI 2015 Multi-Atlas Abdomen Labeling Challenge (Synapse syn3193805); split and "
              "label set of Chen et al., TransUNet, arXiv:2102.04306")

SYNAPSE_SPEC = DatasetSpec(
    name="Synapse", channel_names={"0": "CT"}, labels=SYNAPSE_LABELS, file_ending=".nii.gz",
    check_case=check_btcv_case, write_case=write_btcv_case, reference=_REFERENCE,
    licence="see synapse.org syn3193805", description="BTCV abdomen CT, 8 organs, TransUNet's 18/12 split",
)

SYNAPSE_TRANSUNET_SPEC = DatasetSpec(
    name="Synapse", channel_names={"0": "CT"}, labels=SYNAPSE_LABELS, file_ending=".nii.gz",
    check_case=_no_check, write_case=write_transunet_case, reference=_REFERENCE,
    licence="see synapse.org syn3193805",
    description="TransUNet's preprocessed Synapse (intensities clipped to [-125, 275] HU and scaled to [0, 1], "
                "1 mm spacing), 8 organs, 18/12 split",
)


# ----------------------------------------------------------------------------------------------
# planning


def _require_h5py(path: Path):
    try:
        import h5py
    except ImportError:
        raise ConversionError(f"synapse: reading {path} needs h5py, which is not installed: pip install h5py "
                              f"(or pip install 'nnunetv2_meddisseg[synapse]')") from None
    return h5py


def _numbered(folder: Path, prefix: str) -> Dict[str, Path]:
    pattern = re.compile(prefix + r"(\d+)\.nii(\.gz)?")
    found: Dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        m = pattern.fullmatch(p.name)
        if m and p.is_file():
            case_id = f"case{int(m.group(1)):04d}"
            if case_id in found:
                raise ConversionError(f"two files for {case_id}: {found[case_id]} and {p}")
            found[case_id] = p
    return found


def _plan_btcv(root: Path) -> ConversionPlan:
    images, labels = _numbered(root / "img", "img"), _numbered(root / "label", "label")
    if not images:
        raise ConversionError(f"synapse: no img*.nii.gz volumes found in {root / 'img'}")
    no_label = [c for c in images if c not in labels]
    if no_label:
        raise ConversionError(f"synapse: image {images[no_label[0]]} has no label (expected "
                              f"{root / 'label' / images[no_label[0]].name.replace('img', 'label', 1)})")
    no_image = [c for c in labels if c not in images]
    if no_image:
        raise ConversionError(f"synapse: label {labels[no_image[0]]} has no image (expected "
                              f"{root / 'img' / labels[no_image[0]].name.replace('label', 'img', 1)})")
    cases = {c: SourceCase(c, images[c], labels[c]) for c in sorted(images)}
    missing = [c for c in TRANSUNET_TRAIN_CASES + TRANSUNET_TEST_CASES if c not in cases]
    if missing:
        problem = (f"synapse: {root / 'img' / ('img' + missing[0][4:] + '.nii.gz')} is missing (TransUNet case "
                   f"{missing[0]}); pass --split_file to use other cases")
        return ConversionPlan(SYNAPSE_SPEC, root, cases, [], [], [], split_origin="", split_problem=problem)
    notes = []
    extra = sorted(set(cases) - set(TRANSUNET_TRAIN_CASES + TRANSUNET_TEST_CASES))
    if extra:
        notes.append(f"synapse: {len(extra)} volumes outside TransUNet's lists were left out (e.g. {extra[0]})")
    train, val, _ = make_seeded_split(TRANSUNET_TRAIN_CASES, holdout_count(len(TRANSUNET_TRAIN_CASES)), 0, SPLIT_SEED)
    return ConversionPlan(SYNAPSE_SPEC, root, cases, train, val, sorted(TRANSUNET_TEST_CASES),
                          split_origin=f"TransUNet lists_Synapse (18 train / 12 test); val = seeded {len(val)} of "
                                       f"the training volumes (seed {SPLIT_SEED})", notes=notes)


def _plan_transunet(root: Path) -> ConversionPlan:
    npz_dir, h5_dir = root / "train_npz", root / "test_vol_h5"
    slices: Dict[str, List[Tuple[int, Path]]] = {}
    if npz_dir.is_dir():
        for p in npz_dir.iterdir():
            m = _NPZ.fullmatch(p.name)
            if m:
                slices.setdefault(m.group(1), []).append((int(m.group(2)), p))
    volumes = {m.group(1): p for p in h5_dir.iterdir() if (m := _H5.fullmatch(p.name))} if h5_dir.is_dir() else {}
    if not slices and not volumes:
        raise ConversionError(f"synapse: no caseNNNN_sliceNNN.npz in {npz_dir} and no caseNNNN.npy.h5 in {h5_dir}")
    if volumes:
        _require_h5py(h5_dir)
    both = sorted(set(slices) & set(volumes))
    if both:
        raise ConversionError(f"synapse: {both[0]} is both in {npz_dir} and in {h5_dir} (expected train and test "
                              f"cases to differ)")
    cases: Dict[str, SourceCase] = {}
    for c, items in sorted(slices.items()):
        files = tuple(p for _, p in sorted(items))
        cases[c] = SourceCase(c, files[0], files[0], extra=files)
    for c, p in sorted(volumes.items()):
        cases[c] = SourceCase(c, p, p)
    notes = []
    if not volumes:
        notes.append(f"synapse: no {h5_dir}: no test set written (imagesTs is empty)")
    if not slices:
        notes.append(f"synapse: no {npz_dir}: only the test volumes were converted")
    train, val, _ = make_seeded_split(slices, holdout_count(len(slices)), 0, SPLIT_SEED)
    return ConversionPlan(SYNAPSE_TRANSUNET_SPEC, root, cases, train, val, sorted(volumes),
                          split_origin=f"TransUNet train_npz (train) / test_vol_h5 (test); val = seeded {len(val)} "
                                       f"of the training volumes (seed {SPLIT_SEED})", notes=notes)


def plan_synapse(source: Path) -> ConversionPlan:
    """Synapse from BTCV's ``RawData`` or TransUNet's ``train_npz`` / ``test_vol_h5`` layout."""
    source = existing_source(source, "synapse")
    for root in (source / "RawData" / "Training", source / "Training", source):
        if (root / "img").is_dir() or (root / "label").is_dir():
            for sub in ("img", "label"):
                if not (root / sub).is_dir():
                    raise MissingSourceError(f"synapse: folder {root / sub} does not exist")
            return _plan_btcv(root)
    for root in (source, source / "Synapse", source / "data" / "Synapse"):
        if (root / "train_npz").is_dir() or (root / "test_vol_h5").is_dir():
            return _plan_transunet(root)
    raise MissingSourceError(f"synapse: {source} holds neither BTCV's RawData/Training/img + label nor "
                             f"TransUNet's train_npz / test_vol_h5")
