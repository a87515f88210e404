"""deploy/image_pipeline.py against nnU-Net's own code: its image reader and writer (NaturalImage2DIO), its
preprocessor (DefaultPreprocessor.run_case_npy: transpose, crop to non-zero, the five normalisation schemes)
and its segmentation export (convert_predicted_logits_to_segmentation_with_correct_shape)."""
from pathlib import Path

import numpy as np
import pytest
from nnunetv2.imageio.natural_image_reader_writer import NaturalImage2DIO
from nnunetv2.inference.export_prediction import convert_predicted_logits_to_segmentation_with_correct_shape
from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
from PIL import Image

from nnunetv2_meddisseg.deploy.image_pipeline import (
    preprocess,
    probabilities_from_logits,
    read_case,
    restore_probabilities,
    restore_shape,
    segmentation_from_logits,
    write_segmentation,
)
from nnunetv2_meddisseg.errors import UserError

SCHEMES = ["ZScoreNormalization", "CTNormalization", "NoNormalization", "RescaleTo01Normalization",
           "RGBTo01Normalization"]
PROPERTIES = {"mean": 100.0, "std": 30.0, "percentile_00_5": 20.0, "percentile_99_5": 200.0, "min": 0.0,
              "max": 255.0, "median": 90.0}


def _plans(schemes, use_mask, transpose) -> dict:
    backward = [int(i) for i in np.argsort(transpose)]
    resampling = {"resampling_fn_data": "resample_data_or_seg_to_shape",
                  "resampling_fn_seg": "resample_data_or_seg_to_shape",
                  "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
                  "resampling_fn_data_kwargs": {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None},
                  "resampling_fn_seg_kwargs": {"is_seg": True, "order": 1, "order_z": 0, "force_separate_z": None},
                  "resampling_fn_probabilities_kwargs": {"is_seg": False, "order": 1, "order_z": 0,
                                                         "force_separate_z": None}}
    configuration = {"data_identifier": "x_2d", "preprocessor_name": "DefaultPreprocessor", "patch_size": [16, 16],
                     "spacing": [1.0, 1.0], "normalization_schemes": list(schemes), "use_mask_for_norm": list(use_mask),
                     "architecture": {"network_class_name": "x", "arch_kwargs": {}, "_kw_requires_import": []},
                     **resampling}
    return {"dataset_name": "Dataset999_X", "plans_name": "nnUNetPlans", "configurations": {"2d": configuration},
            "transpose_forward": list(transpose), "transpose_backward": backward,
            "image_reader_writer": "NaturalImage2DIO",
            "foreground_intensity_properties_per_channel": {str(c): PROPERTIES for c in range(len(schemes))}}


def _description(plans: dict, labels=None, regions=None) -> dict:
    cm = plans["configurations"]["2d"]
    return {"num_input_channels": len(cm["normalization_schemes"]),
            "normalization": [{"scheme": s, "use_mask_for_norm": m, "intensity_properties": PROPERTIES}
                              for s, m in zip(cm["normalization_schemes"], cm["use_mask_for_norm"])],
            "transpose_forward": plans["transpose_forward"], "transpose_backward": plans["transpose_backward"],
            "labels": labels or {"background": 0, "a": 1}, "regions_class_order": regions}


def _image(rng, shape=(23, 31), channels=3) -> np.ndarray:
    """(C, 1, X, Y) uint8-valued float32, with a black border (cropped away) and a black hole (filled)."""
    image = rng.integers(1, 256, size=(channels, 1, *shape)).astype(np.float32)
    image[:, :, :3] = 0
    image[:, :, :, -5:] = 0
    image[:, :, 10:13, 10:14] = 0
    return image


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("transpose", [(0, 1, 2), (0, 2, 1)])
def test_preprocess_equals_nnunet(scheme, use_mask, transpose):
    rng = np.random.default_rng(0)
    plans = _plans([scheme, "ZScoreNormalization"], [use_mask, False], transpose)
    pm = PlansManager(plans)
    data = _image(rng, channels=2)
    expected, _, properties = DefaultPreprocessor(verbose=False).run_case_npy(
        data.copy(), None, {"spacing": (999, 1, 1)}, pm, pm.get_configuration("2d"), {"labels": {"background": 0}})
    got, geometry = preprocess(data.copy(), _description(plans))
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert geometry["bbox"] == [list(map(int, b)) for b in properties["bbox_used_for_cropping"]]
    assert tuple(geometry["shape_before_cropping"]) == tuple(properties["shape_before_cropping"])


@pytest.mark.parametrize("regions", [None, [1, 2]], ids=["labels", "regions"])
@pytest.mark.parametrize("transpose", [(0, 1, 2), (0, 2, 1)])
def test_segmentation_export_equals_nnunet(regions, transpose):
    rng = np.random.default_rng(1)
    plans = _plans(["ZScoreNormalization"], [False], transpose)
    pm = PlansManager(plans)
    cm = pm.get_configuration("2d")
    labels = {"background": 0, "a": 1, "b": 2} if regions is None else {"background": 0, "a": [1, 2], "b": 2}
    dataset_json = {"labels": labels, "file_ending": ".png"}
    if regions is not None:
        dataset_json["regions_class_order"] = regions
    data = _image(rng, channels=1)
    _, geometry = preprocess(data.copy(), _description(plans))
    _, _, properties = DefaultPreprocessor(verbose=False).run_case_npy(
        data.copy(), None, {"spacing": (999, 1, 1)}, pm, cm, dataset_json)
    heads = 3 if regions is None else 2
    cropped = [b - a for a, b in geometry["bbox"]]
    logits = rng.standard_normal((heads, *cropped)).astype(np.float16)
    expected = convert_predicted_logits_to_segmentation_with_correct_shape(
        logits.copy(), pm, cm, pm.get_label_manager(dataset_json), properties)
    description = _description(plans, labels, regions)
    got = restore_shape(segmentation_from_logits(logits, regions), geometry, description, 2)
    assert got.shape == expected.shape and np.array_equal(got, expected)
    _, expected_probabilities = convert_predicted_logits_to_segmentation_with_correct_shape(
        logits.copy(), pm, cm, pm.get_label_manager(dataset_json), properties, return_probabilities=True)
    got_probabilities = restore_probabilities(probabilities_from_logits(logits, regions), geometry, description)
    assert got_probabilities.shape == expected_probabilities.shape
    np.testing.assert_allclose(got_probabilities, expected_probabilities, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,channels", [("RGB", 3), ("L", 1), ("RGBA", 4)])
def test_read_equals_nnunet_reader(tmp_path, mode, channels):
    rng = np.random.default_rng(2)
    shape = (9, 13, channels) if channels > 1 else (9, 13)
    path = tmp_path / "case_0000.png"
    Image.fromarray(rng.integers(0, 256, size=shape).astype(np.uint8), mode=mode).save(path)
    expected, _ = NaturalImage2DIO().read_images([str(path)])
    got = read_case([path])
    assert got.dtype == expected.dtype == np.float32 and np.array_equal(got, expected)


def _palette(rng, path: Path, transparency=None) -> None:
    image = Image.fromarray(rng.integers(0, 4, size=(9, 13)).astype(np.uint8), mode="L").convert("P")
    image.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 10, 20, 30])
    image.save(path, **({} if transparency is None else {"transparency": transparency}))


def _grey_palette_bmp(rng, path: Path) -> None:  # an 8-bit BMP is a palette image, even of greys
    Image.fromarray(rng.integers(0, 256, size=(9, 13)).astype(np.uint8)).convert("P").save(path)


def _tif(array, **kwargs):
    def write(rng, path: Path) -> None:
        import tifffile

        tifffile.imwrite(path, array(rng), **kwargs)
    return write


def _animated_png(frames: int):
    def write(rng, path: Path) -> None:
        images = [Image.fromarray(rng.integers(0, 256, size=(9, 13)).astype(np.uint8)) for _ in range(frames)]
        images[0].save(path, save_all=True, append_images=images[1:])
    return write


# images that Pillow's own decoding gives differently from nnU-Net's reader (skimage.io.imread)
KINDS = {
    "palette.png": lambda rng, p: _palette(rng, p),
    "palette_with_transparency.png": lambda rng, p: _palette(rng, p, transparency=1),
    "grey_palette.bmp": _grey_palette_bmp,
    "grey16.png": lambda rng, p: Image.fromarray(rng.integers(0, 65535, size=(9, 13)).astype(np.uint16)).save(p),
    "bilevel.png": lambda rng, p: Image.fromarray(rng.integers(0, 2, size=(9, 13)).astype(bool)).save(p),
    "rgb16.tif": _tif(lambda rng: rng.integers(0, 65535, size=(9, 13, 3)).astype(np.uint16), photometric="rgb"),
    "planar_rgb.tif": _tif(lambda rng: rng.integers(0, 255, size=(3, 9, 13)).astype(np.uint8), photometric="rgb",
                           planarconfig="separate"),
    "float.tif": _tif(lambda rng: rng.random((9, 13)).astype(np.float32)),
    "three_frames.png": _animated_png(3),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_read_equals_nnunet_reader_where_pillow_alone_differs(tmp_path, kind):
    path = tmp_path / f"case_0000{Path(kind).suffix}"
    KINDS[kind](np.random.default_rng(4), path)
    expected, _ = NaturalImage2DIO().read_images([str(path)])
    got = read_case([path])
    assert got.dtype == expected.dtype == np.float32 and got.shape == expected.shape, (got.shape, expected.shape)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("kind", ["grey_with_alpha.png", "two_pages.tif", "two_frames.png"])
def test_images_nnunet_refuses_are_one_line(tmp_path, kind):
    path = tmp_path / f"case_0000{Path(kind).suffix}"
    rng = np.random.default_rng(5)
    if kind == "grey_with_alpha.png":
        Image.fromarray(rng.integers(0, 256, size=(9, 13, 2)).astype(np.uint8), mode="LA").save(path)
    elif kind == "two_pages.tif":
        _tif(lambda r: r.integers(0, 255, size=(2, 9, 13)).astype(np.uint8), photometric="minisblack")(rng, path)
    else:
        _animated_png(2)(rng, path)
    with pytest.raises(AssertionError):
        NaturalImage2DIO().read_images([str(path)])
    with pytest.raises(UserError, match=r"case_0000\.\w+: reads as an array of shape \(.*\), expected a 2D grey"):
        read_case([path])


@pytest.mark.parametrize("top", [3, 300], ids=["uint8", "uint16"])
def test_written_masks_equal_nnunet_writer(tmp_path, top):
    segmentation = np.random.default_rng(3).integers(0, top, size=(1, 11, 7))
    NaturalImage2DIO().write_seg(segmentation, str(tmp_path / "nnunet.png"), {})
    write_segmentation(segmentation, tmp_path / "ours.png")
    ours, theirs = (np.asarray(Image.open(tmp_path / n)) for n in ("ours.png", "nnunet.png"))
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs) and np.array_equal(ours, segmentation[0])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no partial file left


def test_bad_images_are_one_line_errors(tmp_path):
    (tmp_path / "a_0000.png").write_bytes(b"not an image")
    with pytest.raises(UserError, match="a_0000.png: cannot read the image"):
        read_case([tmp_path / "a_0000.png"])
    Image.fromarray(np.zeros((4, 5), np.uint8)).save(tmp_path / "b_0000.png")
    Image.fromarray(np.zeros((4, 6), np.uint8)).save(tmp_path / "b_0001.png")
    with pytest.raises(UserError, match="different sizes"):
        read_case([tmp_path / "b_0000.png", tmp_path / "b_0001.png"])
    plans = _plans(["ZScoreNormalization"] * 3, [False] * 3, (0, 1, 2))
    with pytest.raises(UserError, match="1 channel"):
        preprocess(np.ones((1, 1, 4, 4), np.float32), _description(plans), "b_0000.png")
