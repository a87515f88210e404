"""The plan command's rows of the bad-input table (harness and contract in tests/bad_input_table.py), through
``nnUNetv2_meddisseg_plan``'s ``main`` on a hand-written ``nnUNetPlans.json`` with an empty ``nnUNetPlans_2d``
folder (no nnUNetv2_plan_and_preprocess). The encoder file ``--encoder_weights`` names is refused, without
running it, when it carries a pickle payload."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bad_input_table import Env, Row, check_row, encoder_state_dict

from nnunetv2_meddisseg.planning.plan_meddisseg import main as plan_main

PLAN_DATASET = "Dataset801_Fake"


def fake_preprocessed(env: Env, configurations=("2d",), data_folder: bool = True) -> Path:
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


def plan_ok(tmp, env):
    fake_preprocessed(env)
    return ["-d", "801", "--batch_size", "2"]


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
    fake_preprocessed(env, data_folder=False)  # planned, preprocessing never ran
    return ["-d", "801"]


def plan_3d_only(tmp, env):
    fake_preprocessed(env, configurations=("3d_fullres",))
    return ["-d", "801"]


def plan_patch_not_multiple_of_16(tmp, env):
    fake_preprocessed(env)
    return ["-d", "801", "--patch_size", "50", "64"]


def plan_batch_size_zero(tmp, env):
    fake_preprocessed(env)
    return ["-d", "801", "--batch_size", "0"]


def plan_name_is_a_path(tmp, env):
    fake_preprocessed(env)
    return ["-d", "801", "--plans_name", "../../x"]


def plan_memory_target(value: str):
    def setup(tmp, env):
        fake_preprocessed(env)
        return ["-d", "801", "--gpu_memory_target", value]
    return setup


def plan_rerun_other_settings(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return ["-d", "801", "--batch_size", "4"]


def plan_rerun_same_settings(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return argv


def plan_rerun_overwrite(tmp, env):
    argv = plan_ok(tmp, env)
    assert plan_main(argv) == 0
    return ["-d", "801", "--batch_size", "4", "--overwrite"]


def check_plan_batch_4(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    assert plans["configurations"]["2d"]["batch_size"] == 4


def plan_truncated_json(name: str):
    def setup(tmp, env):
        file = fake_preprocessed(env) / name
        file.write_text(file.read_text()[:40])
        return ["-d", "801"]
    return setup


def plan_weights_missing(tmp, env):
    fake_preprocessed(env)
    return ["-d", "801", "--encoder_weights", str(tmp / "nope.pth")]


def plan_weights_not_a_state_dict(tmp, env):
    fake_preprocessed(env)
    torch.save([1, 2, 3], tmp / "list.pth")
    return ["-d", "801", "--encoder_weights", str(tmp / "list.pth")]


def plan_weights_not_a_torch_file(tmp, env):
    fake_preprocessed(env)
    (tmp / "weights.pth").write_text("<html>404 Not Found</html>")
    return ["-d", "801", "--encoder_weights", str(tmp / "weights.pth")]


def plan_weights_pickled_model(tmp, env):
    fake_preprocessed(env)
    torch.save(torch.nn.Conv2d(3, 4, 1), tmp / "model.pth")  # the module, not its state_dict()
    return ["-d", "801", "--encoder_weights", str(tmp / "model.pth")]


def plan_weights_payload(tmp, env):
    """An encoder file whose unpickling would create ``payload_ran`` (see tests/payload.py)."""
    from payload import Payload

    fake_preprocessed(env)
    state = encoder_state_dict()
    state["layer2.0.conv1.weight"] = Payload(tmp / "payload_ran")
    torch.save(state, tmp / "payload.pth")
    return ["-d", "801", "--encoder_weights", str(tmp / "payload.pth")]


def plan_weights_nan(tmp, env):
    fake_preprocessed(env)
    state = encoder_state_dict()
    state["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(state, tmp / "nan.pth")
    return ["-d", "801", "--encoder_weights", str(tmp / "nan.pth")]


def plan_weights_wrong_shapes(tmp, env):
    fake_preprocessed(env)
    state = encoder_state_dict()
    state["layer2.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)  # the first bad key in the encoder's order
    state["layer3.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)
    torch.save(state, tmp / "wrong.pth")
    return ["-d", "801", "--encoder_weights", str(tmp / "wrong.pth")]


def plan_weights_ok(tmp, env):
    fake_preprocessed(env)
    torch.save(encoder_state_dict(), tmp / "good.pth")
    return ["-d", "801", "--batch_size", "2", "--encoder_weights", str(tmp / "good.pth")]


def check_plan_names_weights(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    assert plans["configurations"]["2d"]["architecture"]["arch_kwargs"]["encoder_weights"] == str(tmp / "good.pth")


def plan_recipe(text):
    """A run with ``--recipe`` naming a file of ``text`` (None: no file)."""
    def setup(tmp, env):
        fake_preprocessed(env)
        if text is not None:
            (tmp / "budget.json").write_text(text)
        return ["-d", "801", "--batch_size", "2", "--recipe", str(tmp / "budget.json")]
    return setup


def check_plan_holds_the_recipe(tmp, env):
    plans = json.loads((env["nnUNet_preprocessed"] / PLAN_DATASET / "nnUNetMedDisSegPlans.json").read_text())
    assert plans["meddisseg_recipe"] == {"num_epochs": 20, "stage2_lr": 0.001}


ROWS = [
    Row("plan/ok", "plan", plan_ok, 0, check=check_plan_written),
    Row("plan/recipe_ok", "plan", plan_recipe('{"num_epochs": 20, "stage2_lr": 0.001}'), 0,
        check=check_plan_holds_the_recipe),
    Row("plan/recipe_missing", "plan", plan_recipe(None), 2,
        ["--recipe", "budget.json: cannot read the recipe file: No such file or directory"]),
    Row("plan/recipe_truncated", "plan", plan_recipe('{"num_epochs": '), 2,
        ["--recipe", "budget.json: not a JSON file of recipe settings (Expecting value"]),
    Row("plan/recipe_unknown_setting", "plan", plan_recipe('{"num_epoch": 20}'), 2,
        ["--recipe", "budget.json: unknown setting 'num_epoch' for MedDisSegRecipe (known: ", "num_epochs"]),
    Row("plan/recipe_bad_value", "plan", plan_recipe('{"stage2_lr": -1}'), 2,
        ["--recipe", "budget.json: MedDisSegRecipe.stage2_lr must be"]),
    Row("plan/unknown_dataset", "plan", plan_unknown_dataset, 2,
        ["-d 777", "missing from nnUNet_raw", "nnUNetv2_meddisseg_convert",
         "nnUNetv2_plan_and_preprocess -d 777 -c 2d"]),
    Row("plan/not_preprocessed", "plan", plan_not_preprocessed, 2,
        [f"{PLAN_DATASET}/nnUNetPlans.json", "not planned and preprocessed", "nnUNetv2_plan_and_preprocess -d 801"]),
    Row("plan/2d_data_missing", "plan", plan_2d_data_missing, 2, ["nnUNetPlans_2d", "not preprocessed"]),
    Row("plan/3d_only", "plan", plan_3d_only, 2, ["no '2d' configuration", "3d_fullres", "-c 2d"]),
    Row("plan/patch_not_multiple_of_16", "plan", plan_patch_not_multiple_of_16, 2,
        ["--patch_size", "multiples of 16", "50 64"]),
    Row("plan/batch_size_zero", "plan", plan_batch_size_zero, 2, ["--batch_size", "at least 1", "0"]),
    Row("plan/plans_name_is_a_path", "plan", plan_name_is_a_path, 2,
        ["--plans_name must be a name of letters, digits", "not a path: got '../../x'"]),
    Row("plan/gpu_memory_target_nan", "plan", plan_memory_target("nan"), 2,
        ["--gpu_memory_target must be a finite number of GB above 0, got nan"]),
    Row("plan/gpu_memory_target_inf", "plan", plan_memory_target("inf"), 2,
        ["--gpu_memory_target must be a finite number of GB above 0, got inf"]),
    Row("plan/gpu_memory_target_negative", "plan", plan_memory_target("-3"), 2,
        ["--gpu_memory_target must be a finite number of GB above 0, got -3.0"]),
    Row("plan/rerun_other_settings", "plan", plan_rerun_other_settings, 2,
        [f"{PLAN_DATASET}/nnUNetMedDisSegPlans.json exists with other settings (configurations.2d.batch_size: 2 -> 4)",
         "pass --overwrite to replace it"]),
    Row("plan/rerun_same_settings", "plan", plan_rerun_same_settings, 0, check=check_plan_written),
    Row("plan/rerun_overwrite", "plan", plan_rerun_overwrite, 0, check=check_plan_batch_4),
    Row("plan/truncated_source_plans", "plan", plan_truncated_json("nnUNetPlans.json"), 2,
        [f"{PLAN_DATASET}/nnUNetPlans.json is not valid JSON", "rerun nnUNetv2_plan_and_preprocess -d 801"]),
    Row("plan/truncated_dataset_json", "plan", plan_truncated_json("dataset.json"), 2,
        [f"{PLAN_DATASET}/dataset.json is not valid JSON"]),
    Row("plan/weights_missing", "plan", plan_weights_missing, 2, ["--encoder_weights", "nope.pth", "does not exist"]),
    Row("plan/weights_not_a_state_dict", "plan", plan_weights_not_a_state_dict, 2,
        ["--encoder_weights", "list.pth", "not a state dict", "list"]),
    Row("plan/weights_not_a_torch_file", "plan", plan_weights_not_a_torch_file, 2,
        ["--encoder_weights", "weights.pth", "not a file written by torch.save"]),
    Row("plan/weights_pickled_model", "plan", plan_weights_pickled_model, 2,
        ["--encoder_weights", "model.pth", "not a plain state dict", "state_dict()"]),
    Row("plan/weights_payload_not_run", "plan", plan_weights_payload, 2,
        ["--encoder_weights", "payload.pth", f"not a plain state dict (needs GLOBAL {open.__module__}.open;",
         "not loaded, since loading them can run code"]),
    Row("plan/weights_nan", "plan", plan_weights_nan, 2,
        ["--encoder_weights", "nan.pth", "key 'layer1.0.conv1.weight' holds NaN or inf values"]),
    Row("plan/weights_wrong_shapes", "plan", plan_weights_wrong_shapes, 2,
        ["--encoder_weights", "wrong.pth", "'layer2.0.conv1.weight'", "(3, 3, 1, 1)"]),
    Row("plan/weights_ok", "plan", plan_weights_ok, 0, check=check_plan_names_weights),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)
