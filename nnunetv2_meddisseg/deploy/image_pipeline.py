"""nnU-Net's 2D preprocessing and segmentation export for natural images, in numpy (no PyTorch, no nnU-Net).

Steps as nnU-Net's ``DefaultPreprocessor.run_case`` and ``convert_predicted_logits_to_segmentation_with_correct_shape``
for ``NaturalImage2DIO`` images: read (C, 1, X, Y) float32 -> transpose -> crop to the non-zero bounding box (holes
filled) -> normalise each channel; after prediction: argmax (or regions) -> uncrop -> transpose back -> a uint8
(uint16 from 255 labels) image. No resampling: such an image's spacing is (999, 1, 1) and the exporter accepts
only plans whose 2D spacing is (1, 1), where nnU-Net's resampling keeps the shape.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageSequence
from scipy.ndimage import binary_fill_holes

from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import write_atomically

__all__ = ["read_image", "read_case", "case_of_images", "check_finite", "preprocess", "segmentation_from_logits",
           "probabilities_from_logits",
           "restore_shape", "restore_probabilities", "write_segmentation", "encode_segmentation",
           "normalise_channel"]

BoundingBox = List[List[int]]


def _pillow_array(image: Image.Image) -> np.ndarray:
    """One frame as imageio's Pillow plugin returns it: palettes in the palette's mode, PNG mode I as 16-bit grey."""
    if image.mode == "P":
        image = image.convert(image.palette.mode)
    elif image.format == "PNG" and image.mode == "I":
        image = image.convert("I;16")
    return np.asarray(image)


def read_image(path: Path, content: Optional[bytes] = None) -> np.ndarray:
    """One image as ``skimage.io.imread`` (NaturalImage2DIO's reader) returns it: .tif via tifffile, others via Pillow
    as imageio reads them (every APNG frame); a leading axis of 3 or 4 moved last. ``content``: bytes read as path."""
    path = Path(path)
    source = path if content is None else io.BytesIO(content)
    tif = path.suffix.lower() in (".tif", ".tiff")
    if tif:
        try:
            import tifffile
        except ImportError as e:
            raise UserError("reading .tif images needs tifffile, as nnU-Net's reader does: pip install tifffile") from e
    try:
        if tif:
            array = np.asarray(tifffile.imread(source))
        else:
            with Image.open(source) as image:
                if image.custom_mimetype == "image/apng":
                    array = np.stack([_pillow_array(frame) for frame in ImageSequence.Iterator(image)])
                else:
                    array = _pillow_array(image)
    except Exception as e:  # noqa: BLE001 (whatever the decoder says about this file is the user's answer)
        raise UserError(f"{path}: cannot read the image ({type(e).__name__}: {e})") from e
    if array.ndim > 2 and array.shape[-1] not in (3, 4) and array.shape[-3] in (3, 4):
        array = np.moveaxis(array, -3, -1)
    return array


def check_finite(image: np.ndarray, path: Path) -> None:
    """Refuse NaN or inf in a float image (C, 1, X, Y): z-score would make the channel NaN, predicted as background."""
    if image.dtype.kind != "f":
        return
    finite = np.isfinite(image)
    if finite.all():
        return
    nan, inf = np.isnan(image).any(axis=0), np.isinf(image).any(axis=0)
    raise UserError(f"{path}: {int(nan.sum())} NaN and {int(inf.sum())} infinite pixel(s) of {nan.size}: the model "
                    f"cannot predict undefined values (nnU-Net's normalisation would spread them over the whole "
                    f"channel); replace them (e.g. numpy.nan_to_num)")


def read_case(files: Sequence[Path]) -> np.ndarray:
    """One file per channel -> (C, 1, X, Y) float32, as NaturalImage2DIO reads them: grey 1 channel, RGB(A) and
    palette 3 (4); what its reader refuses (grey with alpha, more dimensions) and non-finite floats are refused."""
    return case_of_images([(read_image(f), f) for f in files])


def case_of_images(images_read: Sequence[Tuple[np.ndarray, Union[Path, str]]]) -> np.ndarray:
    """``read_case`` of images already read, each with its file (for messages)."""
    images = []
    for array, f in images_read:
        if array.ndim == 3 and array.shape[-1] in (3, 4):
            images.append(array.transpose(2, 0, 1)[:, None])
        elif array.ndim == 2:
            images.append(array[None, None])
        else:
            raise UserError(f"{f}: reads as an array of shape {array.shape}, expected a 2D grey, RGB or RGBA image "
                            f"as nnU-Net's NaturalImage2DIO takes them (grey with alpha? save it without the alpha "
                            f"channel)")
        check_finite(images[-1], f)
    shapes = {i.shape[1:] for i in images}
    if len(shapes) > 1:
        raise UserError(f"{images_read[0][1]}: the channel files of this case have different sizes "
                        f"({', '.join(str(s[1:]) for s in shapes)})")
    return np.vstack(images, dtype=np.float32, casting="unsafe")


def _bounding_box(mask: np.ndarray) -> BoundingBox:
    """Half-open [start, end) per axis of the True entries of ``mask``; the whole array where there are none."""
    box = []
    for axis in range(mask.ndim):
        other = tuple(a for a in range(mask.ndim) if a != axis)
        hits = np.flatnonzero(mask.any(axis=other))
        box.append([int(hits[0]), int(hits[-1]) + 1] if hits.size else [0, mask.shape[axis]])
    return box


def normalise_channel(image: np.ndarray, mask: np.ndarray, scheme: str, use_mask: bool,
                      properties: Dict[str, float]) -> np.ndarray:
    """One channel (1, X, Y) normalised by nnU-Net's ``scheme``; ``mask``: the non-zero region, used if ``use_mask``."""
    eps = 1e-8
    image = image.astype(np.float32)
    if scheme == "ZScoreNormalization":
        if use_mask:
            values = image[mask]
            image[mask] = (values - values.mean()) / max(values.std(), eps)
        else:
            image = (image - image.mean()) / max(image.std(), eps)
    elif scheme == "CTNormalization":
        np.clip(image, properties["percentile_00_5"], properties["percentile_99_5"], out=image)
        image = (image - properties["mean"]) / max(properties["std"], eps)
    elif scheme == "NoNormalization":
        pass
    elif scheme == "RescaleTo01Normalization":
        image -= image.min()
        image /= np.clip(image.max(), a_min=eps, a_max=None)
    elif scheme == "RGBTo01Normalization":
        if image.min() < 0 or image.max() > 255:
            raise UserError(f"RGBTo01Normalization expects values in [0, 255], got [{image.min()}, {image.max()}]")
        image /= 255.0
    else:
        raise UserError(f"normalisation scheme {scheme!r} is not one of nnU-Net's five; the predictor cannot run it")
    return image.astype(np.float32, copy=False)


def preprocess(data: np.ndarray, description: dict, case: str = "the case") -> Tuple[np.ndarray, dict]:
    """data (C, 1, X, Y) as read -> (the network's input (C, 1, X', Y') float32, what ``restore_shape`` needs)."""
    if data.shape[0] != description["num_input_channels"]:
        raise UserError(f"{case}: {data.shape[0]} channel(s), the model takes {description['num_input_channels']}")
    data = data.transpose([0, *[i + 1 for i in description["transpose_forward"]]])
    shape_before_cropping = data.shape[1:]
    mask = binary_fill_holes((data != 0).any(axis=0))
    box = _bounding_box(mask)
    crop = tuple(slice(a, b) for a, b in box)
    data, mask = data[(slice(None), *crop)], mask[crop]
    channels = [normalise_channel(data[c], mask, n["scheme"], n["use_mask_for_norm"], n["intensity_properties"])
                for c, n in enumerate(description["normalization"])]
    return np.stack(channels), {"shape_before_cropping": shape_before_cropping, "bbox": box}


def probabilities_from_logits(logits: np.ndarray, regions_class_order) -> np.ndarray:
    """logits (K, 1, X, Y) -> float32 probabilities: softmax over K, or for regions the sigmoid of each."""
    logits = logits.astype(np.float32)
    if regions_class_order is not None:
        return 1.0 / (1.0 + np.exp(-logits))
    e = np.exp(logits - logits.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def segmentation_from_logits(logits: np.ndarray, regions_class_order) -> np.ndarray:
    """logits (K, 1, X, Y) -> labels (1, X, Y): argmax, or for regions the sigmoid above 0.5 in class order."""
    if regions_class_order is None:
        return logits.argmax(0)
    probabilities = probabilities_from_logits(logits, regions_class_order)
    segmentation = np.zeros(logits.shape[1:], dtype=np.uint16)
    for i, label in enumerate(regions_class_order):
        segmentation[probabilities[i] > 0.5] = label
    return segmentation


def restore_shape(segmentation: np.ndarray, geometry: dict, description: dict, num_foreground_labels: int
                  ) -> np.ndarray:
    """The cropped segmentation (1, X', Y') back into the read image's shape and axis order (1, X, Y)."""
    dtype = np.uint8 if num_foreground_labels < 255 else np.uint16
    full = np.zeros(geometry["shape_before_cropping"], dtype=dtype)
    full[tuple(slice(a, b) for a, b in geometry["bbox"])] = segmentation
    return full.transpose(description["transpose_backward"])


def restore_probabilities(probabilities: np.ndarray, geometry: dict, description: dict) -> np.ndarray:
    """Cropped probabilities (K, 1, X', Y') -> (K, 1, X, Y) in the read image's shape and axis order; outside the
    crop the background's probability is 1 (regions: all 0), as nnU-Net's ``--save_probabilities`` writes."""
    full = np.zeros((probabilities.shape[0], *geometry["shape_before_cropping"]), dtype=np.float32)
    if description["regions_class_order"] is None:
        full[0] = 1
    full[(slice(None), *(slice(a, b) for a, b in geometry["bbox"]))] = probabilities
    return full.transpose([0, *[a + 1 for a in description["transpose_backward"]]])


def write_segmentation(segmentation: np.ndarray, path: Path) -> None:
    """(1, X, Y) labels -> a grey image file, 8-bit (16-bit from label 255) as NaturalImage2DIO writes, atomically."""
    write_atomically(path, lambda tmp: tmp.write_bytes(encode_segmentation(segmentation, path.suffix)))


def encode_segmentation(segmentation: np.ndarray, file_ending: str) -> bytes:
    """The bytes ``write_segmentation`` writes into a file with ``file_ending``."""
    image = Image.fromarray(segmentation[0].astype(np.uint8 if segmentation.max() < 255 else np.uint16, copy=False))
    buffer = io.BytesIO()
    image.save(buffer, format=Image.registered_extensions()[file_ending.lower()])
    return buffer.getvalue()
