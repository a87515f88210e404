"""nnU-Net's own tools on Med-DisSeg models, run as a new nnU-Net user would (docs/nnunet_tools.md,
"nnU-Net's tools on Med-DisSeg models").

Everything runs on the CPU on the generated 64x64 Dataset501 (conftest's ``preprocessed_synthetic``,
12 training cases: nnU-Net's own 5-fold split), with the smoke trainers trained once per module on
folds 0 and 1 with ``--npz``. The module takes about half an hour of a 2-core CPU (two Med-DisSeg smoke
folds, a ResEnc plan, a 3D dataset), so it is in the ``slow`` layer: ``pytest -m slow tests/e2e/test_nnunet_tools.py``.
"""
from __future__ import annotations

import json
import math
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nnunet_cli import planning_environment, run_cli
from PIL import Image
from scratch import scratch_folder

DATASET = "Dataset501_SyntheticPolyps"
OURS = "nnUNetTrainerMedDisSeg_smoke"
DISPERSIVE = "nnUNetTrainerDispersive_smoke"
RESENC = "nnUNetResEncUNetMPlans"
FOLDS = ("0", "1")
CPU = ("-device", "cpu")
NO_WORKERS = ("-npp", "0", "-nps", "0")

pytestmark = pytest.mark.slow


def model_folder(env: dict, trainer: str, plans: str = "nnUNetPlans", configuration: str = "2d",
                 dataset: str = DATASET) -> Path:
    return Path(env["nnUNet_results"]) / dataset / f"{trainer}__{plans}__{configuration}"


def read_png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def probabilities(npz: Path) -> np.ndarray:
    """nnU-Net's saved class probabilities of a 2D case: (classes, 1, 64, 64) float, summing to one."""
    p = np.load(npz)["probabilities"]
    assert p.shape == (2, 1, 64, 64) and np.all(np.isfinite(p)), (npz.name, p.shape)
    np.testing.assert_allclose(p.sum(0), 1.0, atol=1e-4, err_msg=npz.name)
    return p


def assert_same_labels(a: Path, b: Path, names) -> None:
    for name in names:
        assert np.array_equal(read_png(a / name), read_png(b / name)), f"{name}: {a.name} and {b.name} differ"


def train(env: dict, trainer: str, fold: str, *extra: str, dataset: str = "501", configuration: str = "2d"):
    return run_cli(["nnUNetv2_train", dataset, configuration, fold, "-tr", trainer, *CPU, *extra], env)


@pytest.fixture(scope="module")
def env(preprocessed_synthetic, request, tmp_path_factory) -> dict:
    """The conftest environment (our trainers findable through nnUNet_extTrainer) with this module's own
    nnUNet_results."""
    return {**preprocessed_synthetic, "OMP_NUM_THREADS": "1",
            "nnUNet_results": str(scratch_folder(request, tmp_path_factory, "tool_results"))}


@pytest.fixture(scope="module")
def trained(env) -> dict:
    """Med-DisSeg smoke and Dispersive smoke, each trained on folds 0 and 1 with --npz (what
    find_best_configuration and ensembling need)."""
    for trainer in (OURS, DISPERSIVE):
        for fold in FOLDS:
            train(env, trainer, fold, "--npz")
    return {trainer: model_folder(env, trainer) for trainer in (OURS, DISPERSIVE)}


@pytest.fixture(scope="module")
def test_images(env, request, tmp_path_factory) -> Path:
    """Two test images of Dataset501 and their labels (``images/``, ``labels/``)."""
    root = scratch_folder(request, tmp_path_factory, "tool_inputs")
    raw = Path(env["nnUNet_raw"]) / DATASET
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for label in sorted((raw / "labelsTs").glob("*.png"))[:2]:
        shutil.copy(label, root / "labels" / label.name)
        shutil.copy(raw / "imagesTs" / f"{label.stem}_0000.png", root / "images")
    return root


@pytest.fixture(scope="module")
def fold_predictions(env, trained, test_images, request, tmp_path_factory) -> dict:
    """nnUNetv2_predict -f 0 1 --save_probabilities of each trained model on the two test images."""
    root = scratch_folder(request, tmp_path_factory, "tool_predictions")
    out = {}
    for trainer in trained:
        out[trainer] = root / trainer
        run_cli(["nnUNetv2_predict", "-i", test_images / "images", "-o", out[trainer], "-d", "501", "-c", "2d",
                 "-f", *FOLDS, "-tr", trainer, "-p", "nnUNetPlans", "--save_probabilities", *NO_WORKERS, *CPU], env)
    return out


def label_names(test_images: Path):
    return sorted(p.name for p in (test_images / "labels").glob("*.png"))


def test_predict_two_folds_with_probabilities(fold_predictions, test_images):
    """Each case: a label map, its class probabilities (.npz, summing to one) whose argmax is the label map,
    and nnU-Net's properties file."""
    for trainer, out in fold_predictions.items():
        for name in label_names(test_images):
            labels = read_png(out / name)
            assert labels.shape == (64, 64) and set(np.unique(labels)) <= {0, 1}, (trainer, name)
            p = probabilities(out / name.replace(".png", ".npz"))
            assert np.array_equal(p.argmax(0)[0], labels), (trainer, name)
            assert (out / name.replace(".png", ".pkl")).is_file()


def validation_cases(folder: Path) -> list:
    return sorted(p.name for p in (folder / "fold_0" / "validation").glob("*.png"))


@pytest.mark.parametrize("trainer, checkpoint, flags", [
    (DISPERSIVE, "checkpoint_final.pth", ("--val", "--npz")),
    (OURS, "checkpoint_best.pth", ("--val", "--val_best", "--npz")),
], ids=["val_npz", "val_best"])
def test_validation_again_matches_predict_with_the_same_checkpoint(env, trained, trainer, checkpoint, flags, tmp_path):
    """``--val --npz`` re-runs fold 0's validation with checkpoint_final, ``--val --val_best --npz`` with
    checkpoint_best; the probabilities and labels it writes are those of nnUNetv2_predict with that
    checkpoint (``-chk``) on the validation cases' raw images."""
    validation = trained[trainer] / "fold_0" / "validation"
    cases = sorted(p.name for p in validation.glob("*.png"))
    assert len(cases) >= 2  # 12 training cases: nnU-Net's 5-fold split validates fold 0 on 3
    images = tmp_path / "images"
    images.mkdir()
    for name in cases:
        shutil.copy(Path(env["nnUNet_raw"]) / DATASET / "imagesTr" / name.replace(".png", "_0000.png"), images)
    shutil.rmtree(validation)
    train(env, trainer, "0", *flags)
    summary = json.loads((validation / "summary.json").read_text())
    assert math.isfinite(summary["foreground_mean"]["Dice"]) and len(summary["metric_per_case"]) == len(cases)
    out = tmp_path / "predictions"
    run_cli(["nnUNetv2_predict", "-i", images, "-o", out, "-d", "501", "-c", "2d", "-f", "0", "-tr", trainer,
             "-chk", checkpoint, "--save_probabilities", *NO_WORKERS, *CPU], env)
    for name in cases:
        npz = name.replace(".png", ".npz")
        np.testing.assert_allclose(probabilities(validation / npz), probabilities(out / npz), atol=1e-4,
                                   err_msg=f"{trainer} {checkpoint} {name}")
    assert_same_labels(validation, out, cases)


def test_ensemble_averages_the_probabilities(env, fold_predictions, test_images, tmp_path):
    """nnUNetv2_ensemble of Med-DisSeg and Dispersive: the mean of their probabilities, and its argmax."""
    out = tmp_path / "ensemble"
    run_cli(["nnUNetv2_ensemble", "-i", *fold_predictions.values(), "-o", out, "-np", "1", "--save_npz"], env)
    for name in label_names(test_images):
        npz = name.replace(".png", ".npz")
        mean = np.mean([probabilities(folder / npz) for folder in fold_predictions.values()], axis=0)
        np.testing.assert_allclose(probabilities(out / npz), mean, atol=1e-6)
        assert np.array_equal(read_png(out / name), mean.argmax(0)[0]), name


def test_find_best_configuration_same_plans_then_apply_postprocessing(env, trained, fold_predictions, test_images,
                                                                    tmp_path):
    """Our trainer against another one under the same plans, on folds 0 and 1: nnU-Net evaluates both and
    their ensemble, picks one and writes its postprocessing, which nnUNetv2_apply_postprocessing applies
    (it only ever removes foreground)."""
    proc = run_cli(["nnUNetv2_find_best_configuration", "501", "-c", "2d", "-tr", OURS, DISPERSIVE,
                    "-p", "nnUNetPlans", "-f", *FOLDS, "-np", "1"], env)
    info = json.loads((Path(env["nnUNet_results"]) / DATASET / "inference_information.json").read_text())
    assert len(info["all_results"]) == 3 and "*Best*" in proc.stdout  # two models and their ensemble
    assert all(math.isfinite(d) and 0 <= d <= 1 for d in info["all_results"].values())
    best = info["best_model_or_ensemble"]
    assert math.isfinite(best["result_on_crossval_post_pp"])
    pkl = Path(best["postprocessing_file"])
    assert pkl.is_file()
    functions, kwargs = pickle.loads(pkl.read_bytes())
    assert len(functions) == len(kwargs)

    source = fold_predictions[OURS]
    out = tmp_path / "postprocessed"
    run_cli(["nnUNetv2_apply_postprocessing", "-i", source, "-o", out, "-pp_pkl_file", pkl, "-np", "1",
             "-plans_json", best["some_plans_file"]], env)
    for name in label_names(test_images):
        before, after = read_png(source / name), read_png(out / name)
        assert after.shape == before.shape
        assert np.all((after == before) | (after == 0)), name
        if not functions:
            assert np.array_equal(after, before), name


def test_find_best_configuration_across_plans(env, trained, tmp_path):
    """Our trainer (nnUNetPlans) against Dispersive on nnU-Net's ResEnc M preset: the command line tries
    every trainer x plans pair and stops at the first one never trained; nnU-Net's Python function with
    the explicit list of models compares them (and their ensemble)."""
    resenc = resenc_model(env)
    proc = run_cli(["nnUNetv2_find_best_configuration", "501", "-c", "2d", "-tr", OURS, DISPERSIVE,
                    "-p", "nnUNetPlans", RESENC, "-f", "0", "-np", "1"], env, check=False)
    assert proc.returncode != 0 and "does not have an output folder" in proc.stderr
    script = f"""
from nnunetv2.evaluation.find_best_configuration import find_best_configuration
result = find_best_configuration(501, [
    {{'plans': 'nnUNetPlans', 'configuration': '2d', 'trainer': '{OURS}'}},
    {{'plans': '{RESENC}', 'configuration': '2d', 'trainer': '{DISPERSIVE}'}},
], num_processes=1, folds=(0,))
print(sorted(result['all_results']))
"""
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((Path(env["nnUNet_results"]) / DATASET / "inference_information.json").read_text())
    names = {f"{OURS}__nnUNetPlans__2d", f"{DISPERSIVE}__{RESENC}__2d"}
    assert names <= set(info["all_results"]) and len(info["all_results"]) == 3
    assert all(math.isfinite(d) for d in info["all_results"].values())
    assert resenc.is_dir()


_RESENC = {}


def resenc_model(env: dict) -> Path:
    """nnUNetv2_plan_experiment -pl nnUNetPlannerResEncM, preprocess, train Dispersive smoke fold 0 --npz
    (once per module)."""
    folder = model_folder(env, DISPERSIVE, RESENC)
    if not (folder / "fold_0" / "checkpoint_final.pth").is_file():
        planning = planning_environment(env)
        run_cli(["nnUNetv2_plan_experiment", "-d", "501", "-pl", "nnUNetPlannerResEncM"], planning)
        run_cli(["nnUNetv2_preprocess", "-d", "501", "-plans_name", RESENC, "-c", "2d", "-np", "1"], planning)
        proc = train(env, DISPERSIVE, "0", "-p", RESENC, "--npz")
        _RESENC["log"] = proc.stdout
    return folder


def test_dispersive_on_resenc_preset(env):
    """nnUNetTrainerDispersive on nnU-Net's residual-encoder preset (nnUNetPlannerResEncM)."""
    folder = resenc_model(env)
    plans = json.loads((folder / "plans.json").read_text())
    assert plans["configurations"]["2d"]["architecture"]["network_class_name"].endswith("ResidualEncoderUNet")
    checkpoint = torch.load(folder / "fold_0" / "checkpoint_final.pth", map_location="cpu", weights_only=False)
    assert checkpoint["trainer_name"] == DISPERSIVE
    dispersive = checkpoint["logging"]["loss_dispersive"]
    assert len(dispersive) == 1 and math.isfinite(dispersive[0]) and dispersive[0] < 0
    summary = json.loads((folder / "fold_0" / "validation" / "summary.json").read_text())
    assert math.isfinite(summary["foreground_mean"]["Dice"])


def test_export_install_predict_is_pixel_identical(env, trained, fold_predictions, test_images, tmp_path):
    """nnUNetv2_export_model_to_zip (folds 0 and 1) -> nnUNetv2_install_pretrained_model_from_zip into a
    fresh nnUNet_results -> nnUNetv2_predict: the labels and probabilities of the original model. (The
    Dispersive model: nnU-Net's network keeps the archive small; a Med-DisSeg fold's checkpoint is
    about 550 MB, see "Sharing a trained model".)"""
    archive = tmp_path / "model.zip"
    run_cli(["nnUNetv2_export_model_to_zip", "-d", "501", "-o", archive, "-c", "2d", "-tr", DISPERSIVE,
             "-p", "nnUNetPlans", "-f", *FOLDS], env)
    fresh = {**env, "nnUNet_results": str(tmp_path / "fresh_results")}
    Path(fresh["nnUNet_results"]).mkdir()
    run_cli(["nnUNetv2_install_pretrained_model_from_zip", archive], fresh)
    installed = model_folder(fresh, DISPERSIVE)
    for fold in FOLDS:
        assert (installed / f"fold_{fold}" / "checkpoint_final.pth").is_file()
    out = tmp_path / "predictions"
    run_cli(["nnUNetv2_predict", "-i", test_images / "images", "-o", out, "-d", "501", "-c", "2d", "-f", *FOLDS,
             "-tr", DISPERSIVE, "-p", "nnUNetPlans", "--save_probabilities", *NO_WORKERS, *CPU], fresh)
    names = label_names(test_images)
    assert_same_labels(fold_predictions[DISPERSIVE], out, names)
    for name in names:
        npz = name.replace(".png", ".npz")
        assert np.array_equal(probabilities(out / npz), probabilities(fold_predictions[DISPERSIVE] / npz)), name


PREDICTOR_SCRIPT = """
import sys
import torch
from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

model, images, out = sys.argv[1:4]
predictor = nnUNetPredictor(device=torch.device("cpu"), allow_tqdm=False)
try:
    predictor.initialize_from_trained_model_folder(model, use_folds=(0, 1))
    print("found without use_our_trainers")
except RuntimeError as e:
    print("not found:", str(e).splitlines()[0][:60])

from nnunetv2_meddisseg.environment import use_our_trainers
use_our_trainers()
predictor.initialize_from_trained_model_folder(model, use_folds=(0, 1), checkpoint_name="checkpoint_final.pth")
predictor.predict_from_files(images, out, save_probabilities=False, num_processes_preprocessing=1,
                             num_processes_segmentation_export=1)
"""


def test_nnunet_predictor_api_with_use_our_trainers(env, trained, fold_predictions, test_images, tmp_path):
    """nnU-Net's nnUNetPredictor in a Python process without nnUNet_extTrainer: nnU-Net does not find our
    trainer until ``use_our_trainers()`` (README), then predicts the labels of nnUNetv2_predict."""
    python_env = {k: v for k, v in env.items() if k != "nnUNet_extTrainer"}
    out = tmp_path / "predictions"
    proc = subprocess.run([sys.executable, "-c", PREDICTOR_SCRIPT, trained[OURS], test_images / "images", out],
                          env=python_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "not found: Could not find requested nnunet trainer" in proc.stdout
    assert_same_labels(fold_predictions[OURS], out, label_names(test_images))


def test_pretrained_weights_on_another_dataset_after_move_plans(env, trained, request, tmp_path_factory):
    """Dataset502 (another generated dataset) gets Dataset501's plans with
    nnUNetv2_move_plans_between_datasets, is preprocessed with them and trains nnUNetTrainerDispersive
    from fold 0 of its Dataset501 model (-pretrained_weights). (Not Med-DisSeg: one more
    smoke training of it would take minutes of CPU.)"""
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    # folders of its own, not the session's Dataset501: the test preprocesses a second dataset with moved plans
    root = scratch_folder(request, tmp_path_factory, "tool_target")
    target = {**env, **{name: str(root / name) for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}}
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        Path(target[name]).mkdir()
    make_synthetic_dataset(target["nnUNet_raw"], dataset_id=502, num_train=10, num_test=1, size=64, seed=1)
    # the source dataset's preprocessed folder must be reachable: nnU-Net reads both from nnUNet_preprocessed
    shutil.copytree(Path(env["nnUNet_preprocessed"]) / DATASET, Path(target["nnUNet_preprocessed"]) / DATASET,
                    ignore=shutil.ignore_patterns("nnUNetPlans_2d", "nnUNetResEnc*", "gt_segmentations"))
    planning = planning_environment(target)
    # fingerprint and plan (which also puts dataset.json into nnUNet_preprocessed, as nnUNetv2_preprocess needs)
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", "502", "-c", "2d", "-np", "1", "--no_pp"], planning)
    run_cli(["nnUNetv2_move_plans_between_datasets", "-s", "501", "-t", "502", "-sp", "nnUNetPlans",
             "-tp", "nnUNetPlans_from501"], planning)
    run_cli(["nnUNetv2_preprocess", "-d", "502", "-plans_name", "nnUNetPlans_from501", "-c", "2d", "-np", "1"],
            planning)
    pretrained = trained[DISPERSIVE] / "fold_0" / "checkpoint_final.pth"
    proc = run_cli(["nnUNetv2_train", "502", "2d", "0", "-tr", DISPERSIVE, "-p", "nnUNetPlans_from501", *CPU,
                    "-pretrained_weights", pretrained], target)
    assert "Loading pretrained weights from file" in proc.stdout
    folder = model_folder(target, DISPERSIVE, "nnUNetPlans_from501", dataset="Dataset502_SyntheticPolyps")
    summary = json.loads((folder / "fold_0" / "validation" / "summary.json").read_text())
    assert math.isfinite(summary["foreground_mean"]["Dice"])
    # four smoke iterations move the weights little: the fine-tuned model lies much nearer to the weights it
    # started from than fold 1 of Dataset501 (trained from its own random initialisation) does
    source, tuned, other = (weights(path) for path in (
        pretrained, folder / "fold_0" / "checkpoint_final.pth",
        trained[DISPERSIVE] / "fold_1" / "checkpoint_final.pth"))
    assert tuned.keys() == source.keys()
    assert distance(tuned, source) < 0.5 * distance(other, source), (distance(tuned, source), distance(other, source))


def weights(checkpoint: Path) -> dict:
    """The learned tensors of a checkpoint (no BatchNorm statistics)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["network_weights"]
    return {k: v.float() for k, v in state.items() if v.is_floating_point() and "running_" not in k}


def distance(a: dict, b: dict) -> float:
    """Relative L2 distance of two weight sets: ||a - b|| / ||b||."""
    diff = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b)
    return math.sqrt(diff / sum(float((v ** 2).sum()) for v in b.values()))


def write_tiny_3d_dataset(raw: Path, cases: int = 6, size: int = 24) -> None:
    """Dataset503_Tiny3D: ``cases`` noisy 24^3 single-channel volumes (NIfTI) with one bright ball each,
    labelled 1 (nnU-Net's raw format)."""
    import SimpleITK as sitk

    folder = raw / "Dataset503_Tiny3D"
    (folder / "imagesTr").mkdir(parents=True)
    (folder / "labelsTr").mkdir()
    rng = np.random.default_rng(0)
    zz, yy, xx = np.mgrid[0:size, 0:size, 0:size]
    for i in range(cases):
        centre, radius = rng.uniform(8, size - 8, 3), rng.uniform(3, 6)
        label = ((zz - centre[0]) ** 2 + (yy - centre[1]) ** 2 + (xx - centre[2]) ** 2 <= radius ** 2).astype(np.uint8)
        image = (rng.normal(0, 1, label.shape) + 3 * label).astype(np.float32)
        for array, path in ((image, folder / "imagesTr" / f"ball_{i:03d}_0000.nii.gz"),
                            (label, folder / "labelsTr" / f"ball_{i:03d}.nii.gz")):
            sitk.WriteImage(sitk.GetImageFromArray(array), str(path))
    (folder / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "MRI"}, "labels": {"background": 0, "ball": 1}, "numTraining": cases,
        "file_ending": ".nii.gz"}))


def test_dispersive_on_3d_fullres(env, request, tmp_path_factory):
    """nnUNetTrainerDispersive on a 3d_fullres configuration (a tiny generated 3D dataset)."""
    # folders of its own: 3d_fullres needs 3D volumes, which the session's 2D Dataset501 is not
    root = scratch_folder(request, tmp_path_factory, "tool_3d")
    env3d = {**env, **{name: str(root / name) for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}}
    for name in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results"):
        Path(env3d[name]).mkdir()
    write_tiny_3d_dataset(Path(env3d["nnUNet_raw"]))
    run_cli(["nnUNetv2_plan_and_preprocess", "-d", "503", "-c", "3d_fullres", "-np", "1"], planning_environment(env3d))
    proc = train(env3d, DISPERSIVE, "0", dataset="503", configuration="3d_fullres")
    folder = model_folder(env3d, DISPERSIVE, configuration="3d_fullres", dataset="Dataset503_Tiny3D")
    plans = json.loads((folder / "plans.json").read_text())
    assert len(plans["configurations"]["3d_fullres"]["patch_size"]) == 3
    checkpoint = torch.load(folder / "fold_0" / "checkpoint_final.pth", map_location="cpu", weights_only=False)
    dispersive = checkpoint["logging"]["loss_dispersive"]
    assert len(dispersive) == 1 and math.isfinite(dispersive[0])
    assert "loss terms: dispersive" in proc.stdout
    summary = json.loads((folder / "fold_0" / "validation" / "summary.json").read_text())
    assert math.isfinite(summary["foreground_mean"]["Dice"]) and summary["metric_per_case"]
