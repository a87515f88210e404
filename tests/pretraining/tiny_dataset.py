"""A tiny dataset as nnU-Net's planning and preprocessing leave it, written by hand in a second (no
nnUNetv2_plan_and_preprocess): ``Dataset931_Tiny`` with 32x32 RGB images, raw training and test PNGs in
``nnUNet_raw``, and in ``nnUNet_preprocessed`` dataset.json, an ``nnUNetPlans.json`` naming a small PlainConvUNet,
the preprocessed cases (``.npy``, as nnU-Net's NumPy dataset stores them) and ``splits_final.json`` (fold 0:
four training, two validation cases)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import numpy as np
from PIL import Image

__all__ = ["DATASET", "TRAIN", "VAL", "TEST", "tiny_dataset", "meddisseg_plans"]

DATASET = "Dataset931_Tiny"
TRAIN = [f"tiny_{i:03d}" for i in range(4)]
VAL = [f"tiny_{i:03d}" for i in range(4, 6)]
TEST = [f"tiny_test_{i:03d}" for i in range(2)]
SIZE = 32

DATASET_JSON = {"channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "polyp": 1},
                "numTraining": len(TRAIN) + len(VAL), "file_ending": ".png", "name": "Tiny"}


def _plans() -> dict:
    kwargs = {"n_stages": 3, "features_per_stage": [4, 8, 16], "conv_op": "torch.nn.modules.conv.Conv2d",
              "kernel_sizes": [[3, 3]] * 3, "strides": [[1, 1], [2, 2], [2, 2]], "n_conv_per_stage": [1, 1, 1],
              "n_conv_per_stage_decoder": [1, 1], "conv_bias": True,
              "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
              "norm_op_kwargs": {"eps": 1e-05, "affine": True},
              "dropout_op": None, "dropout_op_kwargs": None, "nonlin": "torch.nn.LeakyReLU",
              "nonlin_kwargs": {"inplace": True}}
    resampling = {"is_seg": False, "order": 3, "order_z": 0, "force_separate_z": None}
    config = {"data_identifier": "nnUNetPlans_2d", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
              "patch_size": [SIZE, SIZE], "median_image_size_in_voxels": [float(SIZE), float(SIZE)],
              "spacing": [1.0, 1.0], "normalization_schemes": ["ZScoreNormalization"] * 3,
              "use_mask_for_norm": [False] * 3, "resampling_fn_data": "resample_data_or_seg_to_shape",
              "resampling_fn_seg": "resample_data_or_seg_to_shape", "resampling_fn_data_kwargs": resampling,
              "resampling_fn_seg_kwargs": {**resampling, "is_seg": True, "order": 1},
              "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
              "resampling_fn_probabilities_kwargs": {**resampling, "order": 1}, "batch_dice": True,
              "architecture": {"network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
                               "arch_kwargs": kwargs,
                               "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"]}}
    intensity = {"max": 255.0, "mean": 128.0, "median": 128.0, "min": 0.0, "percentile_00_5": 2.0,
                 "percentile_99_5": 250.0, "std": 40.0}
    return {"dataset_name": DATASET, "plans_name": "nnUNetPlans",
            "original_median_spacing_after_transp": [999.0, 1.0, 1.0],
            "original_median_shape_after_transp": [1, SIZE, SIZE], "image_reader_writer": "NaturalImage2DIO",
            "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
            "experiment_planner_used": "ExperimentPlanner",
            "label_manager": "LabelManager", "configurations": {"2d": config},
            "foreground_intensity_properties_per_channel": {str(c): intensity for c in range(3)}}


def _image(rng: np.random.Generator) -> np.ndarray:
    """(32, 32, 3) uint8: a smooth background with one brighter disc."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    cy, cx, r = rng.uniform(8, 24), rng.uniform(8, 24), rng.uniform(4, 9)
    image = 100 + 40 * np.sin(xx / rng.uniform(3, 8))[..., None] + rng.normal(0, 5, (SIZE, SIZE, 3))
    image[(yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2] += 60
    return np.clip(image, 0, 255).astype(np.uint8)


def tiny_dataset(env: Dict[str, Path], seed: int = 0) -> Path:
    """Write the dataset into ``env``'s nnUNet_raw and nnUNet_preprocessed; returns its preprocessed folder."""
    rng = np.random.default_rng(seed)
    raw = Path(env["nnUNet_raw"]) / DATASET
    folder = Path(env["nnUNet_preprocessed"]) / DATASET
    data = folder / "nnUNetPlans_2d"
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (raw / sub).mkdir(parents=True)
    data.mkdir(parents=True)
    for case in TRAIN + VAL + TEST:
        image = _image(rng)
        split = "Ts" if case in TEST else "Tr"
        Image.fromarray(image).save(raw / f"images{split}" / f"{case}_0000.png")
        if split == "Tr":
            label = (image[..., 0] > 200).astype(np.uint8)
            Image.fromarray(label).save(raw / "labelsTr" / f"{case}.png")
            z = (image.astype(np.float32) - image.mean((0, 1))) / image.std((0, 1))
            np.save(data / f"{case}.npy", np.ascontiguousarray(z.transpose(2, 0, 1)[:, None]))
            np.save(data / f"{case}_seg.npy", label[None, None].astype(np.int8))
    for target in (raw, folder):
        (target / "dataset.json").write_text(json.dumps(DATASET_JSON, indent=2))
    (folder / "nnUNetPlans.json").write_text(json.dumps(_plans(), indent=2))
    (folder / "splits_final.json").write_text(json.dumps([{"train": TRAIN, "val": VAL}], indent=2))
    return folder


def meddisseg_plans() -> Path:
    """``nnUNetMedDisSegPlans.json`` derived from the dataset's plans by ``nnUNetv2_meddisseg_plan`` (batch 2; the
    nnU-Net folders taken from the environment)."""
    from nnunetv2_meddisseg.planning.plan_meddisseg import plan_meddisseg

    return plan_meddisseg(DATASET, batch_size=2, memory_from="estimate")
