"""The train rows of the bad-input table (tests/bad_input_table.py) that need a real training run:
single-channel CT input, 4-channel input, and ``--c`` on a fold without a checkpoint.

Each runs the real ``nnUNetv2_train`` (``-device cpu``, ``nnUNetTrainerMedDisSeg_smoke``: one Stage I
epoch, then Stage II, 4 iterations an epoch) in a subprocess on a tiny generated 3D NIfTI dataset that
stock nnU-Net planned and preprocessed for ``2d``. The other train rows (``-c 3d_fullres``, NaN
input, batch size 1) are tested in tests/training/test_trainer_meddisseg.py (the first also here, through
the real command), a bad seed, recipe file or checkpoint to resume from in tests/training/test_train_input_errors.py;
the rows of the other commands next to their tests (tests/test_bad_input_table.py names them).
"""
import json
import math
from pathlib import Path
from typing import Dict, Sequence

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from nnunet_cli import nnunet_env, planning_environment, run_cli
from scratch import scratch_folder

SMOKE = "nnUNetTrainerMedDisSeg_smoke"
CT_ID, CT_DATASET = 611, "Dataset611_TinyCT"
MR_ID, MR_DATASET = 612, "Dataset612_TinyMR"
MR_CHANNELS = ("T1", "T1c", "T2", "FLAIR")
#: loss terms each stage logs per epoch (the checkpoint's logging), by the stage number in the "stage" curve
STAGE_TERMS = {1.0: ("loss_seg", "loss_seg_perturbed", "loss_consistency", "loss_dispersive"),
               2.0: ("loss_seg", "loss_seg_paths", "loss_fg_bg", "loss_complementarity", "loss_dispersive")}
#: printed by nnunetv2.run.run_training.maybe_load_checkpoint (nnU-Net 2.8) for --c without a checkpoint
NO_CHECKPOINT_WARNING = ("WARNING: Cannot continue training because there seems to be no checkpoint available to "
                         "continue from. Starting a new training...")


def write_dataset(raw: Path, dataset: str, channel_names: Sequence[str], num_slices: int, num_cases: int = 5,
                  seed: int = 0) -> None:
    """imagesTr/labelsTr of ``num_cases`` volumes (num_slices, 64, 64), spacing 1 x 1 x 3 mm, one disc-shaped
    lesion (label 1) per case that is brighter than its surroundings in every channel."""
    folder = raw / dataset
    (folder / "imagesTr").mkdir(parents=True)
    (folder / "labelsTr").mkdir()
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:64, 0:64]

    def write(array: np.ndarray, path: Path) -> None:
        image = sitk.GetImageFromArray(array)
        image.SetSpacing((1.0, 1.0, 3.0))
        sitk.WriteImage(image, str(path))

    for i in range(num_cases):
        cy, cx = rng.uniform(20, 44, 2)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= rng.uniform(8, 14) ** 2
        label = np.repeat(disc[None], num_slices, axis=0).astype(np.uint8)
        for c, name in enumerate(channel_names):
            # CT in Hounsfield units (soft tissue ~40 HU, lesion ~ +120 HU); MR channels in arbitrary units
            base, contrast = (40.0, 120.0) if name == "CT" else (100.0 * (c + 1), 50.0 * (c + 2))
            image = base + rng.normal(0, 20, label.shape) + contrast * label
            write(image.astype(np.float32), folder / "imagesTr" / f"case_{i:03d}_{c:04d}.nii.gz")
        write(label, folder / "labelsTr" / f"case_{i:03d}.nii.gz")
    (folder / "dataset.json").write_text(json.dumps({
        "channel_names": {str(c): name for c, name in enumerate(channel_names)},
        "labels": {"background": 0, "lesion": 1}, "numTraining": num_cases, "file_ending": ".nii.gz"}))


@pytest.fixture(scope="module")
def train_env(request, tmp_path_factory) -> Dict[str, str]:
    """A 1-channel CT dataset (5 cases of 4 x 64 x 64) and a 4-channel MR dataset (5 cases of 2 x 64 x 64),
    both planned and preprocessed for 2d by one nnUNetv2_plan_and_preprocess call; deleted after the
    module's last test."""
    # datasets of its own, not the session's Dataset501: the rows need 1- and 4-channel 3D NIfTI input
    env = nnunet_env(scratch_folder(request, tmp_path_factory, "train_inputs"))
    raw = Path(env["nnUNet_raw"])
    write_dataset(raw, CT_DATASET, ["CT"], num_slices=4, seed=1)
    write_dataset(raw, MR_DATASET, MR_CHANNELS, num_slices=2, seed=2)
    plan_env = planning_environment(env)
    # -npfp 2: nnU-Net's default of 8 fingerprint workers would each start and import torch on a 2-core machine
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", CT_ID, MR_ID, "-c", "2d", "-np", "2", "-npfp", "2"], plan_env)
    return env


def fold_folder(env: Dict[str, str], dataset: str, plans: str = "nnUNetPlans") -> Path:
    return Path(env["nnUNet_results"]) / dataset / f"{SMOKE}__{plans}__2d" / "fold_0"


def check_trained(folder: Path, input_channels: int) -> dict:
    """checkpoint_final.pth of a completed two-stage run on ``input_channels`` channels, with finite
    losses in every epoch; returns the checkpoint."""
    checkpoint = torch.load(folder / "checkpoint_final.pth", map_location="cpu", weights_only=False)
    first_conv = checkpoint["network_weights"]["encoder.conv1.weight"]
    assert first_conv.shape == (64, input_channels, 7, 7)
    assert checkpoint["meddisseg_stage"] == "stage2"
    epochs = checkpoint["current_epoch"]
    stages = checkpoint["logging"]["stage"]
    assert len(stages) == epochs and stages[0] == 1.0 and stages[-1] == 2.0  # both stages ran
    logging = checkpoint["logging"]
    for key in ("train_losses", "val_losses", "ema_fg_dice"):
        assert len(logging[key]) == epochs, key
        assert all(math.isfinite(float(v)) for v in logging[key]), f"{key}: {logging[key]}"
    curves = checkpoint["logging"]
    for epoch, stage in enumerate(stages):
        for term in STAGE_TERMS[stage]:
            assert math.isfinite(curves[term][epoch]), f"{term} in epoch {epoch}: {curves[term]}"
    assert not any(torch.isnan(w).any() for w in checkpoint["network_weights"].values() if w.is_floating_point())
    summary = json.loads((folder / "validation" / "summary.json").read_text())
    assert 0.0 <= summary["foreground_mean"]["Dice"] <= 1.0
    return checkpoint


def test_single_channel_ct_trains_and_continue_without_checkpoint_starts_fresh(train_env):
    """Two rows in one run: single-channel CT input trains, and ``--c`` on a fold that has no checkpoint
    (here the first training of the fold) warns as nnU-Net does and trains from scratch to the end."""
    plans = json.loads((Path(train_env["nnUNet_preprocessed"]) / CT_DATASET / "nnUNetPlans.json").read_text())
    assert plans["configurations"]["2d"]["normalization_schemes"] == ["CTNormalization"]
    folder = fold_folder(train_env, CT_DATASET)
    assert not folder.exists()

    proc = run_cli(["nnUNetv2_train", CT_ID, "2d", "0", "-tr", SMOKE, "-device", "cpu", "--c"], train_env)
    assert NO_CHECKPOINT_WARNING in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "Epoch 0\n" in proc.stdout  # started from the beginning
    assert "photometric perturbation channel-wise" in proc.stdout  # not the RGB colour operations
    check_trained(folder, input_channels=1)


def test_four_channel_input_trains_with_meddisseg_plans(train_env):
    """4 MR modalities through nnUNetv2_meddisseg_plan's plans (MedDisSegNet built from arch_kwargs)."""
    run_cli(["nnUNetv2_meddisseg_plan", "-d", MR_ID], train_env)
    plans_name = "nnUNetMedDisSegPlans"
    proc = run_cli(["nnUNetv2_train", MR_ID, "2d", "0", "-tr", SMOKE, "-p", plans_name, "-device", "cpu"],
                   train_env)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "photometric perturbation channel-wise" in proc.stdout
    folder = fold_folder(train_env, MR_DATASET, plans_name)
    plans = json.loads((folder.parent / "plans.json").read_text())
    configuration = plans["configurations"]["2d"]
    assert configuration["architecture"]["network_class_name"] == "nnunetv2_meddisseg.architectures.MedDisSegNet"
    assert len(configuration["normalization_schemes"]) == 4
    check_trained(folder, input_channels=4)


def test_3d_configuration_is_refused_by_the_real_command(train_env):
    """``nnUNetv2_train ... 3d_fullres`` with our trainer stops at construction with the reason and the fix
    (nnU-Net's command prints the exception; nothing is trained or written)."""
    plans = json.loads((Path(train_env["nnUNet_preprocessed"]) / CT_DATASET / "nnUNetPlans.json").read_text())
    assert "3d_fullres" in plans["configurations"]  # planned (not preprocessed): the 3D volumes allow it
    proc = run_cli(["nnUNetv2_train", CT_ID, "3d_fullres", "0", "-tr", SMOKE, "-device", "cpu"], train_env,
                   check=False)
    assert proc.returncode != 0
    last_line = proc.stderr.strip().splitlines()[-1]
    assert "trains 2D networks only" in last_line and "use the 2d configuration (-c 2d)" in last_line, last_line
    assert not (Path(train_env["nnUNet_results"]) / CT_DATASET / f"{SMOKE}__nnUNetPlans__3d_fullres").exists()
