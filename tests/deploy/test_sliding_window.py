"""deploy/sliding_window.py against nnU-Net's own sliding window (nnunetv2.inference): the same tiles, Gaussian,
padding, mirroring and fold ensembling, on a tiny convolutional network run by PyTorch there and by ONNX
Runtime or OpenVINO here."""
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from acvl_utils.cropping_and_padding.padding import pad_nd_image
from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
from nnunetv2.inference.sliding_window_prediction import compute_gaussian, compute_steps_for_sliding_window
from torch import nn

from nnunetv2_meddisseg.deploy import sliding_window
from nnunetv2_meddisseg.deploy.runtimes import OnnxRuntimeSession, OpenVinoSession
from nnunetv2_meddisseg.deploy.sliding_window import (
    gaussian_importance,
    mirror_combinations,
    pad_to_patch,
    sliding_window_logits,
    tile_starts,
)


@pytest.mark.parametrize("patch", [(16, 16), (32, 24), (7, 5)])
@pytest.mark.parametrize("step", [0.5, 0.3, 1.0])
def test_tile_starts_equal_nnunet(patch, step):
    for image in [patch, (patch[0] + 1, patch[1]), (3 * patch[0] + 5, 2 * patch[1] + 7), (110, 64)]:
        image = tuple(max(i, p) for i, p in zip(image, patch))
        assert tile_starts(image, patch, step) == compute_steps_for_sliding_window(image, patch, step), image


@pytest.mark.parametrize("patch", [(16, 16), (32, 24), (7, 5), (64, 48)])
def test_gaussian_equals_nnunet(patch):
    expected = compute_gaussian(patch, sigma_scale=1. / 8, value_scaling_factor=10, dtype=torch.float16,
                                device=torch.device("cpu")).numpy()
    got = gaussian_importance(patch)
    assert got.dtype == np.float16 and np.array_equal(got, expected)


def test_padding_equals_nnunet():
    data = np.random.default_rng(0).standard_normal((3, 1, 13, 30)).astype(np.float32)
    padded, undo = pad_to_patch(data, (16, 24))
    expected, slicer = pad_nd_image(data, (16, 24), "constant", {"constant_values": 0}, True)
    assert np.array_equal(padded, expected)
    assert np.array_equal(padded[(slice(None), slice(None), *undo)], data)
    assert np.array_equal(expected[slicer], data)


def test_mirror_combinations():
    assert mirror_combinations(None) == [()]
    assert mirror_combinations((0, 1)) == [(), (2,), (3,), (2, 3)]
    assert mirror_combinations((1,)) == [(), (3,)]


class _TinyNet(nn.Module):
    """(B, 2, H, W) -> (B, 3, H, W), not mirror-symmetric (so that mirroring changes the result)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * 3


def _session(net: nn.Module, runtime: str, folder: Path):
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(1, 2, 8, 8),), buffer, input_names=["image"], output_names=["logits"],
                      opset_version=18, dynamo=False,
                      dynamic_axes={n: {0: "b", 2: "h", 3: "w"} for n in ("image", "logits")})
    if runtime == "onnxruntime":
        return OnnxRuntimeSession(buffer.getvalue(), threads=1)
    path = folder / f"{id(net)}.onnx"
    path.write_bytes(buffer.getvalue())
    return OpenVinoSession(path, threads=1)


@pytest.mark.parametrize("runtime,num_folds", [("onnxruntime", 1), ("onnxruntime", 2), ("openvino", 2)])
@pytest.mark.parametrize("mirror_axes", [None, (0, 1)], ids=["no_mirroring", "mirroring"])
@pytest.mark.parametrize("shape", [(37, 21), (16, 24), (9, 50), (80, 72)])
def test_sliding_window_equals_nnunet_predictor(mirror_axes, num_folds, shape, runtime, tmp_path, monkeypatch):
    monkeypatch.setattr(sliding_window, "MAX_BATCH", 8)  # (80, 72): 20 tiles, several calls per fold
    nets = [_TinyNet(seed).eval() for seed in range(num_folds)]
    data = np.random.default_rng(1).standard_normal((2, 1, *shape)).astype(np.float32)
    patch = [16, 24]
    predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=mirror_axes is not None,
                                device=torch.device("cpu"), verbose=False, allow_tqdm=False)
    predictor.configuration_manager = SimpleNamespace(patch_size=patch)
    predictor.label_manager = SimpleNamespace(num_segmentation_heads=3)
    predictor.allowed_mirroring_axes = mirror_axes
    predictor.network = _TinyNet(0).eval()
    predictor.list_of_parameters = [net.state_dict() for net in nets]
    expected = predictor.predict_logits_from_preprocessed_data(torch.from_numpy(data)).numpy()
    got = sliding_window_logits(data, [_session(net, runtime, tmp_path) for net in nets], patch, 0.5, mirror_axes, 3)
    assert got.shape == expected.shape == (3, 1, *shape) and got.dtype == expected.dtype == np.float16
    # float16 results: equal up to a float16 rounding step of the largest values
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=0,
                               atol=2 * float(np.spacing(np.abs(expected).max())))
