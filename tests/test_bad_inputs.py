"""Bad input, one row per case, each through the real command's entry point.

Every row names a command (``convert``, ``plan``, ``evaluate``, ``compare``), a setup that builds
the input under ``tmp_path`` and returns the command's argv, the expected exit code and the
substrings the error must contain. A failing row (exit code != 0) must print exactly one line
``<prog>: error: ...`` on stderr, naming the file or option, with no traceback, and must leave
nothing behind: the set of paths under ``tmp_path`` is the same before and after the command (no
dataset folder, no plans JSON, no summary, no comparison folder). Rows with exit code 0 are the
documented graceful paths (a JPEG-noisy mask is thresholded, ``--overwrite`` replaces a dataset)
and controls showing that the inputs the failing rows break are otherwise accepted.

No error line ever advises ``weights_only=False``. Files carrying a pickle payload (``tests/payload.py``: its
unpickling would create a file under ``tmp_path``) are refused without running it: the encoder file of
``plan``, the checkpoints ``compare`` hands to nnU-Net, and, in the functions after the table, the encoder
file the trainer reads, the checkpoint ``--c`` resumes from and the ablation's checkpoints (the shared model
folder's in tests/test_sharing.py, the benchmark's in tests/benchmarks/test_weight_travel.py). Writes that
fail half-way (a simulated full disk) are tested after the table too.

Nothing here runs nnU-Net's planning, preprocessing or training: plan rows use a hand-written
``nnUNetPlans.json`` with an empty ``nnUNetPlans_2d`` folder. At the end, the real ``nnUNetv2_train`` (nnU-Net's
command, marked e2e: it starts a process) is run on hand-written plans until our trainer refuses its input
(a seed that is no integer, a missing or broken recipe override file, ``--c`` with a truncated checkpoint): one
line ``nnUNetv2_train: error: ...`` and no traceback. The train rows of the bad-input table are tested
elsewhere: ``-c 3d_fullres``, input with NaN and batch size 1 in tests/training/test_trainer_meddisseg.py
(``test_3d_configuration_is_refused_before_anything_is_written``, ``test_nan_input_is_a_clear_error``,
``test_batch_size_one_warns_once_and_has_zero_dispersion``); single-channel CT input, 4-channel input
and ``--c`` without a checkpoint through the real ``nnUNetv2_train`` in tests/e2e/test_train_inputs.py.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from PIL import Image

_DATASETS_TESTS = str(Path(__file__).resolve().parent / "datasets")
if _DATASETS_TESTS not in sys.path:
    sys.path.append(_DATASETS_TESTS)

from convert_trees import expected_binary, make_kvasir_tree, read_png, save, write_split  # noqa: E402
from nnunetv2_meddisseg.datasets.convert import main as convert_main  # noqa: E402
from nnunetv2_meddisseg.evaluation.compare import main as compare_main  # noqa: E402
from nnunetv2_meddisseg.evaluation.evaluate import main as evaluate_main  # noqa: E402
from nnunetv2_meddisseg.planning.plan_meddisseg import main as plan_main  # noqa: E402

Env = Dict[str, Path]

COMMANDS: Dict[str, tuple] = {
    # name: (entry point, program name in the error line)
    "convert": (convert_main, "nnUNetv2_meddisseg_convert"),
    "plan": (plan_main, "nnUNetv2_meddisseg_plan"),
    "evaluate": (evaluate_main, "nnUNetv2_meddisseg_evaluate"),
    "compare": (compare_main, "nnUNetv2_meddisseg_compare"),
}


@dataclass(frozen=True)
class Row:
    """One case: ``setup(tmp, env)`` builds the input and returns argv; ``check(tmp, env)`` (rows with
    exit code 0) verifies the result."""

    name: str
    command: str
    setup: Callable[[Path, Env], List[str]]
    exit_code: int
    expected: Sequence[str] = ()
    check: Optional[Callable[[Path, Env], None]] = None


@pytest.fixture
def env(nnunet_dirs) -> Env:
    """nnUNet_raw / nnUNet_preprocessed / nnUNet_results under ``tmp_path`` (see tests/conftest.py)."""
    return nnunet_dirs


def run_entry_point(command: str, argv: List[str]) -> int:
    """Call the command's ``main`` in this process; its exit code whether returned or raised."""
    entry_point, _ = COMMANDS[command]
    try:
        code = entry_point(argv)
    except SystemExit as e:
        code = e.code
    return 0 if code is None else int(code)


def _tree(root: Path) -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# ------------------------------------------------------------------------------------------------
# converter (Kvasir-SEG layout: images/*.jpg + masks/*.jpg, 24x20 RGB; BTCV NIfTI for labels)

KVASIR_IDS = ["k0", "k1", "k2", "k3"]
KVASIR_DATASET = "Dataset031_KvasirSEG"


def _kvasir(tmp: Path) -> List[str]:
    src = make_kvasir_tree(tmp / "Kvasir-SEG", KVASIR_IDS)
    split = write_split(tmp / "split.json", ["k0", "k1"], ["k2"], ["k3"])
    return ["kvasir-seg", str(src), "-d", "31", "--split-file", str(split), "-np", "1"]


def conv_source_missing(tmp, env):
    return ["kvasir-seg", str(tmp / "nowhere"), "-d", "31", "-np", "1"]


def conv_image_without_mask(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "masks" / "k1.jpg").unlink()
    return argv


def conv_mask_without_image(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "images" / "k2.jpg").unlink()
    return argv


def conv_size_mismatch(tmp, env):
    argv = _kvasir(tmp)
    save(np.zeros((10, 12, 3), np.uint8), tmp / "Kvasir-SEG" / "masks" / "k1.jpg")
    return argv


def conv_corrupt_image(tmp, env):
    argv = _kvasir(tmp)
    (tmp / "Kvasir-SEG" / "images" / "k3.jpg").write_bytes(b"this is not a JPEG file")
    return argv


def conv_empty_source(tmp, env):
    (tmp / "Kvasir-SEG" / "images").mkdir(parents=True)
    (tmp / "Kvasir-SEG" / "masks").mkdir()
    return ["kvasir-seg", str(tmp / "Kvasir-SEG"), "-d", "31", "-np", "1"]


def conv_undeclared_label(tmp, env):
    """BTCV layout; case0006's label holds 14, which is none of the 13 organs."""
    base = tmp / "RawData" / "Training"
    (base / "img").mkdir(parents=True)
    (base / "label").mkdir()
    for n, value in (("0005", 1), ("0006", 14), ("0001", 1)):
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((2, 4, 4), np.int16)), str(base / "img" / f"img{n}.nii.gz"))
        label = np.zeros((2, 4, 4), np.uint8)
        label[0, 0, 0] = value
        sitk.WriteImage(sitk.GetImageFromArray(label), str(base / "label" / f"label{n}.nii.gz"))
    split = write_split(tmp / "split.json", ["case0005"], ["case0006"], ["case0001"])
    return ["synapse", str(tmp), "-d", "31", "--split-file", str(split), "-np", "1"]


def conv_dataset_exists(tmp, env):
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    return [*argv, "--resize", "16"]


def conv_resize_zero(tmp, env):
    return [*_kvasir(tmp), "--resize", "0"]


def conv_resize_one(tmp, env):
    return [*_kvasir(tmp), "--resize", "1"]


def conv_blue_masks(tmp, env):
    """Masks drawn in pure blue (grey value 29 by the usual conversion)."""
    argv = _kvasir(tmp)
    for case in KVASIR_IDS:
        path = tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"
        mask = np.asarray(Image.open(path)).copy()
        mask[..., :2] = 0
        save(mask, path, quality=100)
    return argv


def check_blue_masks_kept(tmp, env):
    labels = env["nnUNet_raw"] / KVASIR_DATASET / "labelsTr"
    for case in ("k0", "k1", "k2"):
        label = read_png(labels / f"{case}.png")
        assert label.any()
        np.testing.assert_array_equal(label, expected_binary(tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"))


def conv_faint_mask(tmp, env):
    """k2's mask drawn at grey 100: below the JPEG threshold, it would come out empty."""
    argv = _kvasir(tmp)
    path = tmp / "Kvasir-SEG" / "masks" / "k2.jpg"
    mask = np.asarray(Image.open(path).convert("L"))
    save(np.where(mask > 127, 100, 0).astype(np.uint8), path, quality=100)
    return argv


def conv_source_is_the_dataset(tmp, env):
    """--overwrite with the dataset of this ID as the source: it would replace its own input."""
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    target = env["nnUNet_raw"] / KVASIR_DATASET
    (target / "Kvasir-SEG").mkdir()
    for sub in ("images", "masks"):
        (tmp / "Kvasir-SEG" / sub).rename(target / "Kvasir-SEG" / sub)
    return ["kvasir-seg", str(target / "Kvasir-SEG"), "-d", "31", "--split-file", argv[5], "-np", "1", "--overwrite"]


def conv_overwrite_replaces(tmp, env):
    argv = _kvasir(tmp)
    assert convert_main(argv) == 0
    return [*argv, "--resize", "16", "--overwrite"]


def check_overwrite_replaced(tmp, env):
    labels = env["nnUNet_raw"] / KVASIR_DATASET / "labelsTr"
    assert read_png(labels / "k0.png").shape == (16, 16)
    assert sorted(p.name for p in env["nnUNet_raw"].iterdir()) == [KVASIR_DATASET]


def conv_noisy_jpeg_mask(tmp, env):
    argv = _kvasir(tmp)
    grey = np.asarray(Image.open(tmp / "Kvasir-SEG" / "masks" / "k0.jpg").convert("L"))
    assert len(np.unique(grey)) > 2  # JPEG really left grey values between 0 and 255
    return argv


def check_noisy_mask_thresholded(tmp, env):
    raw = env["nnUNet_raw"] / KVASIR_DATASET
    for folder, ids in (("labelsTr", ["k0", "k1", "k2"]), ("labelsTs", ["k3"])):
        for case in ids:
            label = read_png(raw / folder / f"{case}.png")
            assert set(np.unique(label).tolist()) <= {0, 1}
            np.testing.assert_array_equal(label, expected_binary(tmp / "Kvasir-SEG" / "masks" / f"{case}.jpg"))
    assert json.loads((raw / "dataset.json").read_text())["labels"] == {"background": 0, "polyp": 1}


# ------------------------------------------------------------------------------------------------
# plan (a hand-written nnUNetPlans.json: no nnUNetv2_plan_and_preprocess)

PLAN_DATASET = "Dataset801_Fake"


def _fake_preprocessed(env: Env, configurations=("2d",), data_folder: bool = True) -> Path:
    """``$nnUNet_preprocessed/Dataset801_Fake`` with nnUNetPlans.json (the given configurations),
    dataset.json and (``data_folder``) the empty preprocessed folders the plans name."""
    folder = env["nnUNet_preprocessed"] / PLAN_DATASET
    folder.mkdir()
    configs = {}
    for c in configurations:
        configs[c] = {
            "data_identifier": f"nnUNetPlans_{c}",
            "preprocessor_name": "DefaultPreprocessor",
            "batch_size": 12,
            "patch_size": [72, 60] if c == "2d" else [32, 72, 60],
            "median_image_size_in_voxels": [72, 60] if c == "2d" else [40, 72, 60],
            "spacing": [1.0, 1.0] if c == "2d" else [1.0, 1.0, 1.0],
            "normalization_schemes": ["ZScoreNormalization"] * 3,
            "use_mask_for_norm": [False] * 3,
            "architecture": {"network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
                             "arch_kwargs": {}, "_kw_requires_import": []},
        }
        if data_folder:
            (folder / f"nnUNetPlans_{c}").mkdir()
    plans = {"dataset_name": PLAN_DATASET, "plans_name": "nnUNetPlans", "configurations": configs,
             "original_median_spacing_after_transp": [999.0, 1.0, 1.0], "image_reader_writer": "NaturalImage2DIO",
             "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2]}
    (folder / "nnUNetPlans.json").write_text(json.dumps(plans, indent=2))
    (folder / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "polyp": 1},
        "numTraining": 4, "file_ending": ".png"}))
    return folder


def _encoder_state_dict() -> dict:
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder

    return ResNet50Encoder(3).state_dict()


def plan_ok(tmp, env):
    _fake_preprocessed(env)
    return ["-d", "801", "--batch-size", "2"]


def check_plan_written(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    config = plans["configurations"]["2d"]
    assert config["patch_size"] == [80, 64] and config["batch_size"] == 2
    assert config["data_identifier"] == "nnUNetPlans_2d"


def plan_unknown_dataset(tmp, env):
    return ["-d", "777"]


def plan_not_preprocessed(tmp, env):
    (env["nnUNet_raw"] / PLAN_DATASET).mkdir()  # converted, never planned
    return ["-d", "801"]


def plan_2d_data_missing(tmp, env):
    _fake_preprocessed(env, data_folder=False)  # planned, preprocessing never ran
    return ["-d", "801"]


def plan_3d_only(tmp, env):
    _fake_preprocessed(env, configurations=("3d_fullres",))
    return ["-d", "801"]


def plan_patch_not_multiple_of_16(tmp, env):
    _fake_preprocessed(env)
    return ["-d", "801", "--patch-size", "50", "64"]


def plan_batch_size_zero(tmp, env):
    _fake_preprocessed(env)
    return ["-d", "801", "--batch-size", "0"]


def plan_name_is_a_path(tmp, env):
    _fake_preprocessed(env)
    return ["-d", "801", "--plans-name", "../../x"]


def plan_memory_target(value: str):
    def setup(tmp, env):
        _fake_preprocessed(env)
        return ["-d", "801", "--gpu-memory-target", value]
    return setup


def plan_rerun_other_settings(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return ["-d", "801", "--batch-size", "4"]


def plan_rerun_same_settings(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return argv


def plan_rerun_overwrite(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return ["-d", "801", "--batch-size", "4", "--overwrite"]


def check_plan_batch_4(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    assert plans["configurations"]["2d"]["batch_size"] == 4


def plan_truncated_json(name: str):
    def setup(tmp, env):
        file = _fake_preprocessed(env) / name
        file.write_text(file.read_text()[:40])
        return ["-d", "801"]
    return setup


def plan_weights_missing(tmp, env):
    _fake_preprocessed(env)
    return ["-d", "801", "--encoder-weights", str(tmp / "nope.pth")]


def plan_weights_not_a_state_dict(tmp, env):
    _fake_preprocessed(env)
    torch.save([1, 2, 3], tmp / "list.pth")
    return ["-d", "801", "--encoder-weights", str(tmp / "list.pth")]


def plan_weights_not_a_torch_file(tmp, env):
    _fake_preprocessed(env)
    (tmp / "weights.pth").write_text("<html>404 Not Found</html>")
    return ["-d", "801", "--encoder-weights", str(tmp / "weights.pth")]


def plan_weights_pickled_model(tmp, env):
    _fake_preprocessed(env)
    torch.save(torch.nn.Conv2d(3, 4, 1), tmp / "model.pth")  # the module, not its state_dict()
    return ["-d", "801", "--encoder-weights", str(tmp / "model.pth")]


def plan_weights_payload(tmp, env):
    """An encoder file whose unpickling would create ``payload_ran`` (see tests/payload.py)."""
    from payload import Payload

    _fake_preprocessed(env)
    state = _encoder_state_dict()
    state["layer2.0.conv1.weight"] = Payload(tmp / "payload_ran")
    torch.save(state, tmp / "payload.pth")
    return ["-d", "801", "--encoder-weights", str(tmp / "payload.pth")]


def plan_weights_nan(tmp, env):
    _fake_preprocessed(env)
    state = _encoder_state_dict()
    state["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, tmp / "nan.pth")
    return ["-d", "801", "--encoder-weights", str(tmp / "nan.pth")]


def plan_weights_wrong_shapes(tmp, env):
    _fake_preprocessed(env)
    state = _encoder_state_dict()
    state["layer2.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)  # the first bad key in the encoder's order
    state["layer3.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)
    torch.save(state, tmp / "wrong.pth")
    return ["-d", "801", "--encoder-weights", str(tmp / "wrong.pth")]


def plan_weights_ok(tmp, env):
    _fake_preprocessed(env)
    torch.save(_encoder_state_dict(), tmp / "good.pth")
    return ["-d", "801", "--batch-size", "2", "--encoder-weights", str(tmp / "good.pth")]


def check_plan_names_weights(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    assert plans["configurations"]["2d"]["architecture"]["arch_kwargs"]["encoder_weights"] == str(tmp / "good.pth")


# ------------------------------------------------------------------------------------------------
# evaluate (three 4x4 binary PNG cases; -o points at a summary that must not appear on errors)


def _write_png(path: Path, arr) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(path)


def _eval_folders(tmp: Path) -> List[str]:
    mask = np.zeros((4, 4))
    mask[:2] = 1
    for case in "abc":
        _write_png(tmp / "ref" / f"{case}.png", mask)
        _write_png(tmp / "pred" / f"{case}.png", mask)
    return ["-ref", str(tmp / "ref"), "-pred", str(tmp / "pred"), "-o", str(tmp / "out" / "summary.json")]


def eval_ok(tmp, env):
    return _eval_folders(tmp)


def check_eval_summary(tmp, env):
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert [c["case"] for c in summary["metric_per_case"]] == ["a", "b", "c"]
    assert summary["mean"]["dice"] == 1.0


def eval_output_is_a_reference_label(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:-1], str(tmp / "ref" / "a.png")]


def eval_output_inside_prediction_folder(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:-1], str(tmp / "pred" / "summary.json")]


def eval_output_is_a_folder(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "out").mkdir()
    return [*argv[:-1], str(tmp / "out")]


def eval_missing_cases(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "pred" / "b.png").unlink()
    (tmp / "pred" / "c.png").unlink()
    return argv


def eval_different_endings(tmp, env):
    argv = _eval_folders(tmp)
    for case in "abc":
        (tmp / "pred" / f"{case}.png").unlink()
        sitk.WriteImage(sitk.GetImageFromArray(np.zeros((4, 4), np.uint8)), str(tmp / "pred" / f"{case}.nii.gz"))
    return argv


def eval_empty_prediction_folder(tmp, env):
    argv = _eval_folders(tmp)
    for case in "abc":
        (tmp / "pred" / f"{case}.png").unlink()
    return argv


def eval_prediction_folder_without_labels(tmp, env):
    argv = eval_empty_prediction_folder(tmp, env)
    (tmp / "pred" / "notes.txt").write_text("not a label image")
    return argv


def eval_mask_0_255(tmp, env):
    argv = _eval_folders(tmp)
    _write_png(tmp / "pred" / "c.png", np.full((4, 4), 255))
    return argv


def eval_label_not_declared(tmp, env):
    argv = _eval_folders(tmp)
    _write_png(tmp / "pred" / "b.png", np.full((4, 4), 2))
    (tmp / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "polyp": 1}, "file_ending": ".png"}))
    return [*argv, "-djfile", str(tmp / "dataset.json")]


def eval_multiclass_undeclared(tmp, env):
    """Synapse-like labels 0..8 evaluated without -djfile / --labels."""
    argv = _eval_folders(tmp)
    organs = np.arange(16).reshape(4, 4) % 9
    for case in "abc":
        _write_png(tmp / "ref" / f"{case}.png", organs)
        _write_png(tmp / "pred" / f"{case}.png", organs)
    return argv


def eval_ref_folder_missing(tmp, env):
    argv = _eval_folders(tmp)
    return [*argv[:1], str(tmp / "labelsTs_nope"), *argv[2:]]


def eval_shape_mismatch(tmp, env):
    argv = _eval_folders(tmp)
    _write_png(tmp / "pred" / "a.png", np.zeros((5, 4)))
    return argv


def eval_corrupt_prediction(tmp, env):
    argv = _eval_folders(tmp)
    (tmp / "pred" / "a.png").write_bytes(b"not a png")
    return argv


# ------------------------------------------------------------------------------------------------
# compare (a raw dataset with a test set; models missing under nnUNet_results)

COMPARE_DATASET = "Dataset802_Cmp"


def _raw_with_test_set(env: Env, labels_ts: bool = True) -> Path:
    raw = env["nnUNet_raw"] / COMPARE_DATASET
    (raw / "dataset.json").parent.mkdir(parents=True)
    (raw / "dataset.json").write_text(json.dumps({
        "channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "polyp": 1},
        "numTraining": 0, "file_ending": ".png"}))
    _write_png(raw / "imagesTs" / "t0_0000.png", np.zeros((8, 8, 3)))
    if labels_ts:
        _write_png(raw / "labelsTs" / "t0.png", np.zeros((8, 8)))
    return raw


def _compare_argv(tmp: Path, dataset: str) -> List[str]:
    return ["-d", dataset, "--device", "cpu", "-o", str(tmp / "comparison")]


def cmp_negative_option(option: str):
    def setup(tmp, env):
        return [*_compare_argv(tmp, "802"), option, "-1"]
    return setup


def cmp_unknown_dataset(tmp, env):
    return _compare_argv(tmp, "777")


def cmp_no_test_labels(tmp, env):
    _raw_with_test_set(env, labels_ts=False)
    return _compare_argv(tmp, "802")


def cmp_baseline_model_missing(tmp, env):
    _raw_with_test_set(env)
    return _compare_argv(tmp, "802")


def cmp_meddisseg_model_missing(tmp, env):
    _raw_with_test_set(env)
    fold = env["nnUNet_results"] / COMPARE_DATASET / "nnUNetTrainer__nnUNetPlans__2d" / "fold_0"
    fold.mkdir(parents=True)
    (fold / "checkpoint_final.pth").write_bytes(b"")  # only its existence is checked before the error
    return _compare_argv(tmp, "802")


def _two_models(env: Env, baseline: object, meddisseg: object = None) -> Dict[str, Path]:
    """Both models' ``fold_0/checkpoint_final.pth``: bytes written as they are, anything else with torch.save."""
    files = {}
    for name, content in (("nnUNetTrainer__nnUNetPlans__2d", baseline),
                          ("nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d", meddisseg)):
        fold = env["nnUNet_results"] / COMPARE_DATASET / name / "fold_0"
        fold.mkdir(parents=True)
        files[name] = fold / "checkpoint_final.pth"
        if isinstance(content, bytes):
            files[name].write_bytes(content)
        else:
            torch.save(content if content is not None else {"network_weights": {}}, files[name])
    return files


def cmp_zero_byte_checkpoint(tmp, env):
    _raw_with_test_set(env)
    _two_models(env, b"")
    return _compare_argv(tmp, "802")


def cmp_truncated_checkpoint(tmp, env):
    _raw_with_test_set(env)
    files = _two_models(env, {"network_weights": {"w": torch.zeros(1000)}})
    data = files["nnUNetTrainer__nnUNetPlans__2d"].read_bytes()
    files["nnUNetTrainer__nnUNetPlans__2d"].write_bytes(data[: len(data) // 2])
    return _compare_argv(tmp, "802")


def cmp_checkpoint_payload(tmp, env):
    from payload import Payload

    _raw_with_test_set(env)
    _two_models(env, {"network_weights": {}}, {"network_weights": {}, "logging": Payload(tmp / "payload_ran")})
    return _compare_argv(tmp, "802")


def cmp_output_inside_test_labels(tmp, env):
    raw = _raw_with_test_set(env)
    _two_models(env, {"network_weights": {}})
    return [*_compare_argv(tmp, "802")[:-1], str(raw / "labelsTs" / "comparison")]


# ------------------------------------------------------------------------------------------------

ROWS = [
    Row("convert/source_missing", "convert", conv_source_missing, 2, ["nowhere", "does not exist"]),
    Row("convert/image_without_mask", "convert", conv_image_without_mask, 2,
        ["images/k1.jpg", "has no mask", "masks/k1.jpg"]),
    Row("convert/mask_without_image", "convert", conv_mask_without_image, 2, ["masks/k2.jpg", "has no image"]),
    Row("convert/size_mismatch", "convert", conv_size_mismatch, 2, ["masks/k1.jpg", "12x10", "expected the same size"]),
    Row("convert/corrupt_image", "convert", conv_corrupt_image, 2, ["cannot read image", "images/k3.jpg"]),
    Row("convert/empty_source", "convert", conv_empty_source, 2, ["no images", "Kvasir-SEG/images"]),
    Row("convert/undeclared_label", "convert", conv_undeclared_label, 2, ["label0006.nii.gz", "14"]),
    Row("convert/dataset_exists", "convert", conv_dataset_exists, 2, [KVASIR_DATASET, "already exists", "--overwrite"]),
    Row("convert/resize_zero", "convert", conv_resize_zero, 2, ["--resize", "0", "positive"]),
    Row("convert/resize_one", "convert", conv_resize_one, 2, ["--resize must be at least 16 pixels", "got 1"]),
    Row("convert/blue_masks_kept", "convert", conv_blue_masks, 0, check=check_blue_masks_kept),
    Row("convert/faint_mask_would_be_empty", "convert", conv_faint_mask, 2,
        ["mask ", "masks/k2.jpg would be written empty: its values reach", "but none exceeds half its range (127.5)"]),
    Row("convert/source_inside_the_dataset", "convert", conv_source_is_the_dataset, 2,
        [f"{KVASIR_DATASET}/Kvasir-SEG is inside ", "the dataset this conversion writes (and --overwrite replaces)"]),
    Row("convert/overwrite_replaces", "convert", conv_overwrite_replaces, 0, check=check_overwrite_replaced),
    Row("convert/noisy_jpeg_mask_thresholded", "convert", conv_noisy_jpeg_mask, 0, check=check_noisy_mask_thresholded),
    Row("plan/ok", "plan", plan_ok, 0, check=check_plan_written),
    Row("plan/unknown_dataset", "plan", plan_unknown_dataset, 2,
        ["-d 777", "missing from nnUNet_raw", "nnUNetv2_meddisseg_convert", "nnUNetv2_plan_and_preprocess -d 777 -c 2d"]),
    Row("plan/not_preprocessed", "plan", plan_not_preprocessed, 2,
        [f"{PLAN_DATASET}/nnUNetPlans.json", "not planned and preprocessed", "nnUNetv2_plan_and_preprocess -d 801"]),
    Row("plan/2d_data_missing", "plan", plan_2d_data_missing, 2, ["nnUNetPlans_2d", "not preprocessed"]),
    Row("plan/3d_only", "plan", plan_3d_only, 2, ["no '2d' configuration", "3d_fullres", "-c 2d"]),
    Row("plan/patch_not_multiple_of_16", "plan", plan_patch_not_multiple_of_16, 2,
        ["--patch-size", "multiples of 16", "50 64"]),
    Row("plan/batch_size_zero", "plan", plan_batch_size_zero, 2, ["--batch-size", "at least 1", "0"]),
    Row("plan/plans_name_is_a_path", "plan", plan_name_is_a_path, 2,
        ["--plans-name must be a name of letters, digits", "not a path: got '../../x'"]),
    Row("plan/gpu_memory_target_nan", "plan", plan_memory_target("nan"), 2,
        ["--gpu-memory-target must be a finite number of GB above 0, got nan"]),
    Row("plan/gpu_memory_target_inf", "plan", plan_memory_target("inf"), 2,
        ["--gpu-memory-target must be a finite number of GB above 0, got inf"]),
    Row("plan/gpu_memory_target_negative", "plan", plan_memory_target("-3"), 2,
        ["--gpu-memory-target must be a finite number of GB above 0, got -3.0"]),
    Row("plan/rerun_other_settings", "plan", plan_rerun_other_settings, 2,
        [f"{PLAN_DATASET}/nnUNetMedDisSegPlans.json exists with other settings (configurations.2d.batch_size: 2 -> 4)",
         "pass --overwrite to replace it"]),
    Row("plan/rerun_same_settings", "plan", plan_rerun_same_settings, 0, check=check_plan_written),
    Row("plan/rerun_overwrite", "plan", plan_rerun_overwrite, 0, check=check_plan_batch_4),
    Row("plan/truncated_source_plans", "plan", plan_truncated_json("nnUNetPlans.json"), 2,
        [f"{PLAN_DATASET}/nnUNetPlans.json is not valid JSON", "rerun nnUNetv2_plan_and_preprocess -d 801"]),
    Row("plan/truncated_dataset_json", "plan", plan_truncated_json("dataset.json"), 2,
        [f"{PLAN_DATASET}/dataset.json is not valid JSON"]),
    Row("plan/weights_missing", "plan", plan_weights_missing, 2, ["--encoder-weights", "nope.pth", "does not exist"]),
    Row("plan/weights_not_a_state_dict", "plan", plan_weights_not_a_state_dict, 2,
        ["--encoder-weights", "list.pth", "not a state dict", "list"]),
    Row("plan/weights_not_a_torch_file", "plan", plan_weights_not_a_torch_file, 2,
        ["--encoder-weights", "weights.pth", "not a file written by torch.save"]),
    Row("plan/weights_pickled_model", "plan", plan_weights_pickled_model, 2,
        ["--encoder-weights", "model.pth", "not a plain state dict", "state_dict()"]),
    Row("plan/weights_payload_not_run", "plan", plan_weights_payload, 2,
        ["--encoder-weights", "payload.pth", f"not a plain state dict (needs GLOBAL {open.__module__}.open;",
         "not loaded, since loading them can run code"]),
    Row("plan/weights_nan", "plan", plan_weights_nan, 2,
        ["--encoder-weights", "nan.pth", "key 'layer1.0.conv1.weight' holds NaN or inf values"]),
    Row("plan/weights_wrong_shapes", "plan", plan_weights_wrong_shapes, 2,
        ["--encoder-weights", "wrong.pth", "'layer2.0.conv1.weight'", "(3, 3, 1, 1)"]),
    Row("plan/weights_ok", "plan", plan_weights_ok, 0, check=check_plan_names_weights),
    Row("evaluate/ok", "evaluate", eval_ok, 0, check=check_eval_summary),
    Row("evaluate/output_is_a_reference_label", "evaluate", eval_output_is_a_reference_label, 2,
        ["-o ", "ref/a.png is inside -ref ", "the summary would be written into the input; choose a file outside it"]),
    Row("evaluate/output_inside_prediction_folder", "evaluate", eval_output_inside_prediction_folder, 2,
        ["pred/summary.json is inside -pred "]),
    Row("evaluate/output_is_a_folder", "evaluate", eval_output_is_a_folder, 2,
        ["out is a folder: name the summary file, e.g. ", "out/summary.json"]),
    Row("evaluate/missing_cases", "evaluate", eval_missing_cases, 2,
        ["prediction folder", "lacks 2 of 3 cases", "first missing: b.png"]),
    Row("evaluate/different_file_endings", "evaluate", eval_different_endings, 2,
        ["prediction folder", ".nii.gz", ".png", "same file ending"]),
    Row("evaluate/empty_prediction_folder", "evaluate", eval_empty_prediction_folder, 2,
        ["prediction folder", "pred is empty: expected one .png file per case of the reference folder", "ref",
         "(predict into it first)"]),
    Row("evaluate/prediction_folder_without_labels", "evaluate", eval_prediction_folder_without_labels, 2,
        ["prediction folder", "pred holds no label images (", "expected one .png file per case"]),
    Row("evaluate/mask_0_255", "evaluate", eval_mask_0_255, 2, ["c.png", "{255}", "outside the declared set", "0/255"]),
    Row("evaluate/label_not_declared", "evaluate", eval_label_not_declared, 2,
        ["b.png", "{2}", "outside the declared set {0, 1}"]),
    Row("evaluate/multiclass_undeclared", "evaluate", eval_multiclass_undeclared, 2,
        ["a.png", "{2, 3, 4, 5, 6, 7, 8}", "outside the declared set {0, 1}", "-djfile dataset.json",
         "--labels 0 1 2 3 4 5 6 7 8"]),
    Row("evaluate/ref_folder_missing", "evaluate", eval_ref_folder_missing, 2,
        ["reference folder not found", "labelsTs_nope"]),
    Row("evaluate/shape_mismatch", "evaluate", eval_shape_mismatch, 2, ["a.png", "shape"]),
    Row("evaluate/corrupt_prediction", "evaluate", eval_corrupt_prediction, 2, ["cannot read label image", "a.png"]),
    Row("compare/unknown_dataset", "compare", cmp_unknown_dataset, 2, ["-d 777", "no dataset with this ID", "nnUNet_raw"]),
    Row("compare/no_test_labels", "compare", cmp_no_test_labels, 2, [f"{COMPARE_DATASET}/labelsTs", "not found"]),
    Row("compare/baseline_model_missing", "compare", cmp_baseline_model_missing, 2,
        ["no trained model: ", "nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth not found (train it first"]),
    Row("compare/npp_negative", "compare", cmp_negative_option("-npp"), 2, ["-npp must be 0 or more, got -1"]),
    Row("compare/num_overlays_negative", "compare", cmp_negative_option("--num-overlays"), 2,
        ["--num-overlays must be 0 or more, got -1"]),
    Row("compare/zero_byte_checkpoint", "compare", cmp_zero_byte_checkpoint, 2,
        ["nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth is empty (0 bytes)"]),
    Row("compare/truncated_checkpoint", "compare", cmp_truncated_checkpoint, 2,
        ["nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth cannot be read as a checkpoint (truncated or corrupt?"]),
    Row("compare/checkpoint_payload_not_run", "compare", cmp_checkpoint_payload, 2,
        ["nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d/fold_0/checkpoint_final.pth holds pickled objects other than "
         "tensors", "it was not loaded, since loading such objects can run code"]),
    Row("compare/output_inside_test_labels", "compare", cmp_output_inside_test_labels, 2,
        ["-o ", "labelsTs/comparison is inside the input folder ", "choose a folder outside it"]),
    Row("compare/meddisseg_model_missing", "compare", cmp_meddisseg_model_missing, 2,
        ["no trained model: neither ",
         "nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d/fold_0/checkpoint_final.pth nor ",
         "nnUNetTrainerMedDisSeg__nnUNetPlans__2d/fold_0/checkpoint_final.pth found (train it first"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, env, capsys):
    work = tmp_path / "work"
    work.mkdir()
    argv = row.setup(work, env)
    capsys.readouterr()  # drop what a setup's own command printed
    before = _tree(tmp_path)
    code = run_entry_point(row.command, argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert "weights_only" not in err  # never the advice to load with weights_only=False
    assert code == row.exit_code, f"exit code {code}, expected {row.exit_code}; stderr: {err}"
    if row.exit_code == 0:
        row.check(work, env)
        return
    lines = err.strip().splitlines()
    prefix = f"{COMMANDS[row.command][1]}: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), f"expected one '{prefix}...' line, got:\n{err}"
    for text in row.expected:
        assert text in lines[0], f"{text!r} not in {lines[0]!r}"
    after = _tree(tmp_path)
    assert after == before, f"left behind: {sorted(after - before)}, removed: {sorted(before - after)}"


# the train rows of the bad-input table, tested outside this table (see the module docstring): case -> (file, test)
TRAIN_ROWS = {
    "-c 3d_fullres": ("training/test_trainer_meddisseg.py",
                      "test_3d_configuration_is_refused_before_anything_is_written"),
    "batch size 1": ("training/test_trainer_meddisseg.py", "test_batch_size_one_warns_once_and_has_zero_dispersion"),
    "input with NaN": ("training/test_trainer_meddisseg.py", "test_nan_input_is_a_clear_error"),
    "single-channel CT": ("e2e/test_train_inputs.py",
                          "test_single_channel_ct_trains_and_continue_without_checkpoint_starts_fresh"),
    "4-channel input": ("e2e/test_train_inputs.py", "test_four_channel_input_trains_with_meddisseg_plans"),
    "--c without checkpoint": ("e2e/test_train_inputs.py",
                               "test_single_channel_ct_trains_and_continue_without_checkpoint_starts_fresh"),
}


def test_table_covers_every_command_and_train_row():
    failing = [r for r in ROWS if r.exit_code != 0]
    assert len(failing) >= 20
    assert {r.exit_code for r in failing} == {2}  # one exit code for every command's user mistakes (README)
    assert {r.command for r in failing} == set(COMMANDS)
    assert all(r.expected for r in failing) and all(r.check for r in ROWS if r.exit_code == 0)
    tests = Path(__file__).resolve().parent
    for case, (file, test) in TRAIN_ROWS.items():
        assert f"\ndef {test}(" in (tests / file).read_text(), f"train row {case!r}: {test} not in tests/{file}"


# ------------------------------------------------------------------------------------------------
# pickle payloads in the other files we load (the plan's encoder file is a row above, the shared model
# folder's checkpoints in tests/test_sharing.py): refused, never run, and no advice to load unsafely


def test_encoder_weights_payload_is_refused_without_unsafe_advice(tmp_path):
    """What the trainer (and the network's constructor) reports for an encoder file carrying code."""
    from payload import Payload

    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights

    state = _encoder_state_dict()
    state["conv1.weight"] = Payload(tmp_path / "payload_ran")
    torch.save(state, tmp_path / "encoder.pth")
    with pytest.raises(ValueError) as e:
        load_resnet50_weights(ResNet50Encoder(3), str(tmp_path / "encoder.pth"))
    message = str(e.value)
    assert message == (f"encoder weights {tmp_path / 'encoder.pth'} holds pickled objects other than tensors, numbers "
                       f"and containers (needs GLOBAL {open.__module__}.open); it was not loaded, since loading such objects "
                       f"can run code: save plain data (state_dict() and built-in types) instead")
    assert "weights_only" not in message and not (tmp_path / "payload_ran").exists()


def test_encoder_weights_with_nan_are_refused(tmp_path):
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights

    state = _encoder_state_dict()
    state["bn1.running_var"][3] = float("inf")
    torch.save(state, tmp_path / "inf.pth")
    with pytest.raises(ValueError, match=r"key 'bn1.running_var' holds NaN or inf values \(expected finite weights\)"):
        load_resnet50_weights(ResNet50Encoder(3), str(tmp_path / "inf.pth"))


def test_ablation_checkpoint_payload_is_refused(tmp_path):
    """The ablation table reads the training time of each run's checkpoint."""
    import numpy as np
    from payload import Payload

    from nnunetv2_meddisseg.ablation.runs import epoch_seconds
    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile

    logging = {"epoch_start_timestamps": [np.float64(1.0)], "epoch_end_timestamps": [np.float64(3.5)]}
    torch.save({"logging": logging}, tmp_path / "checkpoint_final.pth")
    assert sum(epoch_seconds(tmp_path / "checkpoint_final.pth")) == 2.5
    logging["epoch_end_timestamps"] = [Payload(tmp_path / "payload_ran")]
    torch.save({"logging": logging}, tmp_path / "checkpoint_final.pth")
    with pytest.raises(UnsafeTorchFile, match=f"needs GLOBAL {open.__module__}.open"):
        epoch_seconds(tmp_path / "checkpoint_final.pth")
    assert not (tmp_path / "payload_ran").exists()


def test_evaluate_write_failure_leaves_nothing(tmp_path, env, capsys, monkeypatch):
    """A full disk while the summary is written: one line naming the file and the OS error, no ``.tmp``."""
    import errno

    import nnunetv2_meddisseg.evaluation.evaluate as evaluate

    argv = _eval_folders(tmp_path)
    real_dump = json.dump

    def disk_full(obj, f, **kwargs):
        f.write("{")
        raise OSError(errno.ENOSPC, "No space left on device", f.name)

    monkeypatch.setattr(evaluate.json, "dump", disk_full)
    before = _tree(tmp_path)
    assert run_entry_point("evaluate", argv) == 2
    monkeypatch.setattr(evaluate.json, "dump", real_dump)
    err = capsys.readouterr().err.strip()
    assert err == f"nnUNetv2_meddisseg_evaluate: error: cannot write the summary {tmp_path / 'out' / 'summary.json'}: " \
                  f"No space left on device"
    assert _tree(tmp_path) - before <= {"out"}  # the folder -o names may stay, never a file


def test_convert_write_failure_leaves_nothing_and_names_the_path(tmp_path, env, capsys, monkeypatch):
    """A full disk while a case is written: one line naming the file and the OS error, no partial folder."""
    import errno

    import nnunetv2_meddisseg.datasets.image_io as image_io

    work = tmp_path / "work"
    argv = _kvasir(work)
    real_save = Image.Image.save

    def disk_full(self, fp, *args, **kwargs):
        if str(fp).endswith("k2.png"):
            raise OSError(errno.ENOSPC, "No space left on device", str(fp))
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(image_io.Image.Image, "save", disk_full)
    before = _tree(tmp_path)
    assert run_entry_point("convert", argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"nnUNetv2_meddisseg_convert: error: cannot write {env['nnUNet_raw']}/.{KVASIR_DATASET}.partial/")
    assert err.endswith("labelsTr/k2.png: No space left on device") and err.count("\n") == 0
    assert _tree(tmp_path) == before


# ------------------------------------------------------------------------------------------------
# nnUNetv2_train --c: the checkpoint our trainers resume from (read before nnU-Net reads it)


def test_truncated_checkpoint_latest_names_the_file_and_checkpoint_best(tmp_path):
    from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming
    from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError

    latest, best = tmp_path / "checkpoint_latest.pth", tmp_path / "checkpoint_best.pth"
    torch.save({"network_weights": {"w": torch.zeros(1000)}}, best)
    latest.write_bytes(best.read_bytes()[:1500])
    with pytest.raises(TrainingInputRuntimeError) as e:  # a RuntimeError, printed by nnUNetv2_train as one line
        read_checkpoint_for_resuming(str(latest))
    message = str(e.value)
    assert message.startswith(f"cannot read the checkpoint {latest} (truncated or corrupt? ")
    assert message.endswith(f"): copy {best} over it to resume from the best epoch, or train again without --c")
    assert "\n" not in message
    best.unlink()
    with pytest.raises(RuntimeError, match=r"\): train again without --c$"):
        read_checkpoint_for_resuming(str(latest))


def test_resuming_from_a_checkpoint_carrying_code_is_refused(tmp_path):
    from payload import Payload

    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile
    from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming

    torch.save({"network_weights": {}, "logging": {"x": [Payload(tmp_path / "payload_ran")]}},
               tmp_path / "checkpoint_latest.pth")
    with pytest.raises(UnsafeTorchFile, match="it was not loaded, since loading such objects can run code"):
        read_checkpoint_for_resuming(str(tmp_path / "checkpoint_latest.pth"))
    assert not (tmp_path / "payload_ran").exists()


# ------------------------------------------------------------------------------------------------
# nnUNetv2_train (nnU-Net's console command, not ours): an input mistake our trainers raise ends it with one line
# ``nnUNetv2_train: error: ...`` and no traceback (cli.install_excepthook, installed by nnU-Net's trainer search)

TRAIN_PROG = "nnUNetv2_train"


def _training_folders(root: Path) -> dict:
    """The environment for nnU-Net's commands with Dataset999_Tiny's plans (the hand-written 32x32 plans of
    tests/training/test_trainer_meddisseg.py) and dataset.json in nnUNet_preprocessed and one placeholder case
    (nnU-Net infers its dataset class from it; never read): enough to construct and initialize a trainer."""
    training_tests = str(Path(__file__).resolve().parent / "training")
    if training_tests not in sys.path:
        sys.path.append(training_tests)
    from nnunet_cli import nnunet_env
    from test_trainer_meddisseg import DATASET, DATASET_JSON, tiny_plans

    env = nnunet_env(root)
    folder = Path(env["nnUNet_preprocessed"]) / DATASET
    (folder / "nnUNetPlans_2d").mkdir(parents=True)
    (folder / "nnUNetPlans_2d" / "case_000.b2nd").touch()
    (folder / "nnUNetPlans.json").write_text(json.dumps(tiny_plans()))
    (folder / "dataset.json").write_text(json.dumps(DATASET_JSON))
    for name in ("nnUNet_meddisseg_seed", "nnUNet_meddisseg_recipe"):
        env.pop(name, None)
    return env


def _train_error(env: dict, *extra: str) -> str:
    """Run ``nnUNetv2_train 999 2d 0 -tr nnUNetTrainerMedDisSeg -device cpu`` (plus ``extra``), which must fail
    without a traceback; its last non-empty stderr line."""
    from nnunet_cli import run_cli

    proc = run_cli([TRAIN_PROG, "999", "2d", "0", "-tr", "nnUNetTrainerMedDisSeg", "-device", "cpu", *extra], env,
                   check=False, timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, f"nothing on stderr; stdout:\n{proc.stdout[-2000:]}"
    # one error line, the last; lines before it are warnings of nnU-Net's imports (timm's FutureWarning)
    assert [line for line in lines if line.startswith(f"{TRAIN_PROG}: error: ")] == lines[-1:], proc.stderr
    return lines[-1]


@pytest.mark.e2e
def test_train_with_a_seed_that_is_no_integer_is_one_line(tmp_path):
    env = _training_folders(tmp_path)
    env["nnUNet_meddisseg_seed"] = "abc"
    assert _train_error(env) == f"{TRAIN_PROG}: error: nnUNet_meddisseg_seed must be an integer >= 0, got 'abc'"


@pytest.mark.e2e
@pytest.mark.parametrize("broken", [False, True], ids=["missing", "not_json"])
def test_train_with_a_missing_or_broken_recipe_file_is_one_line(tmp_path, broken):
    env = _training_folders(tmp_path)
    recipe = tmp_path / "budget.json"
    if broken:
        recipe.write_text('{"num_epochs": ')
    env["nnUNet_meddisseg_recipe"] = str(recipe)
    if broken:
        expected = f"{recipe}: not a JSON file of recipe overrides (Expecting value: line 1 column 16 (char 15))"
    else:
        expected = f"nnUNet_meddisseg_recipe: cannot read the recipe override file '{recipe}': No such file or directory"
    assert _train_error(env) == f"{TRAIN_PROG}: error: {expected}"


@pytest.mark.e2e
def test_train_continuing_from_a_truncated_checkpoint_is_one_line(tmp_path):
    env = _training_folders(tmp_path)
    fold = Path(env["nnUNet_results"]) / "Dataset999_Tiny" / "nnUNetTrainerMedDisSeg__nnUNetPlans__2d" / "fold_0"
    fold.mkdir(parents=True)
    torch.save({"network_weights": {"w": torch.zeros(1000)}}, fold / "checkpoint_best.pth")
    (fold / "checkpoint_latest.pth").write_bytes((fold / "checkpoint_best.pth").read_bytes()[:1500])
    line = _train_error(env, "--c")
    assert line.startswith(f"{TRAIN_PROG}: error: cannot read the checkpoint {fold / 'checkpoint_latest.pth'} "
                           f"(truncated or corrupt? ")
    assert line.endswith(f"): copy {fold / 'checkpoint_best.pth'} over it to resume from the best epoch, or train "
                         f"again without --c")


def test_excepthook_prints_a_user_error_in_one_line_and_hands_on_every_other(monkeypatch, capsys):
    from nnunetv2_meddisseg.cli import install_excepthook
    from nnunetv2_meddisseg.training.errors import TrainingInputError, TrainingInputRuntimeError

    handed_on = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: handed_on.append(args))
    monkeypatch.setattr(sys, "argv", [str(Path("venv") / "bin" / TRAIN_PROG), "999", "2d", "0"])
    install_excepthook()
    hook = sys.excepthook
    install_excepthook()
    assert sys.excepthook is hook  # installed once

    seed = TrainingInputError("nnUNet_meddisseg_seed must be an integer >= 0, got 'abc'")
    hook(type(seed), seed, None)
    checkpoint = TrainingInputRuntimeError("cannot read the checkpoint x.pth (truncated or corrupt?\n  EOFError: )")
    hook(type(checkpoint), checkpoint, None)
    assert capsys.readouterr().err == (
        f"{TRAIN_PROG}: error: nnUNet_meddisseg_seed must be an integer >= 0, got 'abc'\n"
        f"{TRAIN_PROG}: error: cannot read the checkpoint x.pth (truncated or corrupt? EOFError: )\n")
    assert handed_on == []

    bug = ValueError("a bug keeps its traceback")
    hook(ValueError, bug, None)
    interrupt = KeyboardInterrupt()
    hook(KeyboardInterrupt, interrupt, None)
    assert handed_on == [(ValueError, bug, None), (KeyboardInterrupt, interrupt, None)]
    assert capsys.readouterr().err == ""


def test_nnunet_trainer_search_installs_the_excepthook_once(monkeypatch, capsys):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    from nnunetv2_meddisseg.environment import trainer_folder

    def previous(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", previous)
    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    for _ in range(2):  # nnU-Net imports the trainer module anew for every search
        recursive_find_trainer_class_by_name("nnUNetTrainerMedDisSeg")
    assert sys.excepthook is not previous and sys.excepthook.previous is previous


def test_training_input_errors_keep_their_former_types():
    from nnunetv2_meddisseg.cli import UserError
    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile
    from nnunetv2_meddisseg.training.errors import (TrainingInputError, TrainingInputFileNotFoundError,
                                                          TrainingInputRuntimeError)

    assert issubclass(TrainingInputError, UserError) and issubclass(TrainingInputError, ValueError)
    assert issubclass(TrainingInputRuntimeError, TrainingInputError)
    assert issubclass(TrainingInputRuntimeError, RuntimeError)
    missing = TrainingInputFileNotFoundError("encoder weights file not found: x.pth (the plans' encoder_weights)")
    assert isinstance(missing, TrainingInputError) and isinstance(missing, FileNotFoundError)
    assert str(missing) == "encoder weights file not found: x.pth (the plans' encoder_weights)"
    assert issubclass(UnsafeTorchFile, UserError) and issubclass(UnsafeTorchFile, ValueError)
