"""The Troubleshooting table (docs/troubleshooting.md, linked from the README) quotes the messages the tools
really print.

Every backtick-quoted message in the table's first column is either triggered here through the real
entry point (our commands' ``main``, nnU-Net's trainer lookup, the trainer itself) and checked against
what it printed, or listed in ``NOT_TRIGGERED`` with the reason. The trainers' errors are shown as
``nnUNetv2_train`` prints them (``_train_error_of``: an uncaught ``SystemExit``'s line; the
real command is run in tests/training/test_train_input_errors.py). ``...`` in a quote stands for a part
that varies (a path, a count): each piece between them must appear, in order, in the real output.
"""
from __future__ import annotations

import contextlib
import io
import re
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List

import pytest
import torch
from bad_input_table import encoder_state_dict, row_module, run_entry_point

from nnunetv2_meddisseg.environment import trainer_folder

ROOT = Path(__file__).resolve().parents[1]
convert_rows, plan_rows, evaluate_rows, compare_rows, export_rows, predict_rows = map(
    row_module, ("convert", "plan", "evaluate", "compare", "export", "predict_onnx"))
_TRAINING_TESTS = str(Path(__file__).resolve().parent / "training")
if _TRAINING_TESTS not in sys.path:
    sys.path.append(_TRAINING_TESTS)


def troubleshooting_quotes(text: str) -> List[str]:
    """The backtick-quoted texts of the first column of the Troubleshooting table, in order."""
    section = text.split("# Troubleshooting", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
    quotes = []
    for row in rows:
        first_cell = row.split(" | ", 1)[0].lstrip("| ")
        quotes += re.findall(r"`([^`]+)`", first_cell)
    return quotes


def _command(command: str, setup: Callable) -> Callable[[Path, Dict[str, Path]], str]:
    """A trigger running one of the bad-input table's setups through the command's entry point; its stderr."""
    def trigger(tmp: Path, env) -> str:
        argv = setup(tmp, env)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run_entry_point(command, argv)
        assert code == 2, err.getvalue()
        return err.getvalue()
    return trigger


def _with_flags(setup: Callable, *flags: str) -> Callable:
    """``setup``'s command line with ``flags`` added."""
    return lambda tmp, env: [*setup(tmp, env), *flags]


def _error_of(call: Callable[[], object]) -> str:
    """``TypeName: message`` of what ``call`` raises, as a traceback's last line shows it."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 (any exception: its text is what the user sees)
        return f"{type(e).__name__}: {e}"
    raise AssertionError("no error raised")


def _train_error_of(call: Callable[[], object]) -> str:
    """What ``nnUNetv2_train`` prints on stderr when ``call`` raises, where nothing catches the error: the text
    ``code`` of a ``SystemExit`` (our trainers' errors, ``training.errors``) as Python prints it, else the
    traceback."""
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", [str(Path("bin") / "nnUNetv2_train")])
            call()
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        return e.code + "\n"
    except Exception as e:  # noqa: BLE001 (any exception: its traceback is what the user sees)
        return "".join(traceback.format_exception(e))
    raise AssertionError("no error raised")


def trainer_not_found(tmp, env) -> str:
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("nnUNet_extTrainer", raising=False)
        return _error_of(lambda: recursive_find_trainer_class_by_name("nnUNetTrainerMedDisSeg"))


def trainer_3d(tmp, env) -> str:
    from copy import deepcopy

    from test_trainer_meddisseg import DATASET_JSON, tiny_plans

    from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

    plans = tiny_plans(patch_size=(16, 32, 32), configuration="3d_fullres")
    plans["continue_training"] = False
    return _error_of(lambda: nnUNetTrainerMedDisSeg(plans, "3d_fullres", 0, deepcopy(DATASET_JSON),
                                                    torch.device("cpu")))


def imagenet_not_cached(tmp, env) -> str:
    from nnunetv2_meddisseg.blocks.encoder import IMAGENET, resolve_encoder_weights

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_HOME", str(tmp / "empty_torch_home"))
        return _error_of(lambda: resolve_encoder_weights(IMAGENET))


def plan_weights_missing_key(tmp, env):
    plan_rows.fake_preprocessed(env)
    state = encoder_state_dict()
    del state["layer2.0.conv1.weight"]
    torch.save(state, tmp / "partial.pth")
    return ["-d", "801", "--encoder_weights", str(tmp / "partial.pth")]


def _smoke_trainer(env):
    """The smoke trainer on the tiny plans of tests/training (a placeholder preprocessed folder, as there)."""
    from test_trainer_meddisseg import DATASET, make_trainer

    folder = env["nnUNet_preprocessed"] / DATASET / "nnUNetPlans_2d"
    folder.mkdir(parents=True)
    (folder / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    return make_trainer()


def nan_batch(tmp, env) -> str:
    from test_trainer_meddisseg import make_batch

    trainer = _smoke_trainer(env)
    trainer.on_train_epoch_start()
    batch = make_batch()
    batch["data"][0, 0, 0, 0] = float("nan")
    return _train_error_of(lambda: trainer.train_step(batch))


def single_sample_batch(tmp, env) -> str:
    from test_trainer_meddisseg import make_batch

    trainer = _smoke_trainer(env)
    trainer.on_train_epoch_start()
    trainer.train_step(make_batch(b=1))
    return Path(trainer.log_file).read_text()


def dispersive_batch_too_small(tmp, env) -> str:
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    trainer = _smoke_trainer(env)
    # the centred form needs 3 samples; the tiny plans' batch is 2
    trainer.recipe = replace(trainer.recipe, dispersive_variant="infonce_cosine_centred")
    nnunet_start = nnUNetTrainer.on_train_start
    nnUNetTrainer.on_train_start = lambda self: None  # no dataloaders here
    try:
        trainer.on_train_start()
    finally:
        nnUNetTrainer.on_train_start = nnunet_start
    return Path(trainer.log_file).read_text()


def no_gradient_epoch(tmp, env) -> str:
    from test_trainer_meddisseg import make_batch

    trainer = _smoke_trainer(env)
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    for p in (p for group in trainer.optimizer.param_groups for p in group["params"]):
        p.register_hook(torch.zeros_like)  # every gradient zero, as after a GradScaler's scale has collapsed
    trainer.on_train_epoch_end([trainer.train_step(make_batch())])
    return Path(trainer.log_file).read_text()


def three_valued_mask(tmp, env) -> str:
    import numpy as np
    from PIL import Image

    from nnunetv2_meddisseg.datasets.image_io import read_binary_mask

    mask = np.zeros((10, 10), np.uint8)
    mask[:3] = 255
    mask[5:] = 128
    Image.fromarray(mask).save(tmp / "mask.png")
    return _error_of(lambda: read_binary_mask(tmp / "mask.png"))


def _cvc_tree(tmp: Path, middle_value: int) -> Path:
    """CVC-ClinicDB's PNG layout, three 0 / 255 masks; mask 2 with ``middle_value`` over 30 % of its pixels."""
    import numpy as np
    from PIL import Image

    for sub in ("Original", "Ground Truth"):
        (tmp / "cvc" / sub).mkdir(parents=True)
    for case in ("1", "2", "3"):
        Image.fromarray(np.zeros((10, 10, 3), np.uint8)).save(tmp / "cvc" / "Original" / f"{case}.png")
        mask = np.zeros((10, 10), np.uint8)
        mask[:3] = 255
        if case == "2":
            mask[5:8] = middle_value
        Image.fromarray(mask).save(tmp / "cvc" / "Ground Truth" / f"{case}.png")
    return tmp / "cvc"


def ambiguous_masks(tmp, env) -> List[str]:
    return ["cvc-clinicdb", str(_cvc_tree(tmp, 128)), "-d", "32", "-np", "1"]


def mask_threshold_out_of_range(tmp, env) -> List[str]:
    return ["cvc-clinicdb", str(_cvc_tree(tmp, 128)), "-d", "32", "-np", "1", "--mask_threshold", "255"]


def mask_threshold_negative(tmp, env) -> List[str]:
    return ["cvc-clinicdb", str(_cvc_tree(tmp, 128)), "-d", "32", "-np", "1", "--mask_threshold", "-3"]


def nan_image(tmp, env) -> str:
    import numpy as np
    from PIL import Image

    from nnunetv2_meddisseg.datasets.image_io import read_rgb

    Image.fromarray(np.full((4, 4), np.nan, np.float32)).save(tmp / "image.tif")
    return _error_of(lambda: read_rgb(tmp / "image.tif"))


def foreground_vanishes(tmp, env) -> str:
    import numpy as np
    from PIL import Image

    from nnunetv2_meddisseg.datasets.cases import SourceCase
    from nnunetv2_meddisseg.datasets.image_io import write_binary_2d_case

    mask = np.zeros((100, 100), np.uint8)
    mask[41, 43] = 255
    Image.fromarray(mask).save(tmp / "mask.png")
    Image.fromarray(np.zeros((100, 100, 3), np.uint8)).save(tmp / "image.png")
    case = SourceCase("c", tmp / "image.png", tmp / "mask.png")
    return _error_of(lambda: write_binary_2d_case(case, tmp / "o_0000.png", tmp / "o.png", resize=16))


def share_inside_model_folder(tmp, env) -> str:
    from nnunetv2_meddisseg.sharing import main as share_main

    model = tmp / "nnUNetTrainer__nnUNetPlans__2d"
    (model / "fold_0").mkdir(parents=True)
    (model / "plans.json").write_text("{}")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert share_main([str(model), str(model / "fold_0" / "shared")]) == 2
    return err.getvalue()


def truncated_checkpoint_latest(tmp, env) -> str:
    from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming

    torch.save({"network_weights": {"w": torch.zeros(1000)}}, tmp / "checkpoint_best.pth")
    (tmp / "checkpoint_latest.pth").write_bytes((tmp / "checkpoint_best.pth").read_bytes()[:1500])
    return _train_error_of(lambda: read_checkpoint_for_resuming(str(tmp / "checkpoint_latest.pth")))


def seed_not_a_number(tmp, env) -> str:
    from nnunetv2_meddisseg.environment import SEED_ENVIRONMENT_VARIABLE
    from nnunetv2_meddisseg.training.seeding import run_seed_from_environment

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SEED_ENVIRONMENT_VARIABLE, "abc")
        return _train_error_of(run_seed_from_environment)


def plans_recipe_unknown_setting(tmp, env) -> str:
    from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe, recipe_from_plans

    plans = {"plans_name": "nnUNetMedDisSegPlans", "meddisseg_recipe": {"num_epoch": 20}}
    return _train_error_of(lambda: recipe_from_plans(MedDisSegRecipe(), plans))


def encoder_weights_not_here(tmp, env) -> str:
    from copy import deepcopy

    from test_trainer_meddisseg import MEDDISSEG, make_trainer, tiny_plans

    architecture = deepcopy(MEDDISSEG)
    architecture["arch_kwargs"]["encoder_weights"] = str(tmp / "resnet50_of_another_machine.pth")
    folder = env["nnUNet_preprocessed"] / "Dataset999_Tiny" / "nnUNetPlans_2d"
    folder.mkdir(parents=True)
    (folder / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    trainer = make_trainer(plans=tiny_plans(architecture), initialize=False)
    return _train_error_of(trainer.initialize)


def ddp_on_cpu(tmp, env) -> str:
    from nnunetv2.run.run_training import run_training

    with contextlib.redirect_stdout(io.StringIO()):
        return _error_of(lambda: run_training("999", "2d", 0, num_gpus=2, device=torch.device("cpu")))


def memory_from_gpu_without_cuda(tmp: Path, env) -> str:
    from unittest import mock

    from nnunetv2_meddisseg.planning import plan_meddisseg

    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        return _error_of(lambda: plan_meddisseg._memory_measurement("gpu"))


TRIGGERS: Dict[str, Callable[[Path, Dict[str, Path]], str]] = {
    "--memory_from gpu: no CUDA GPU is available here": memory_from_gpu_without_cuda,
    "RuntimeError: Could not find requested nnunet trainer nnUNetTrainerMedDisSeg in nnunetv2.training.nnUNetTrainer":
        trainer_not_found,
    "nnUNetv2_meddisseg_plan: error: -d ...: the dataset is missing from nnUNet_raw":
        _command("plan", plan_rows.plan_unknown_dataset),
    "nnUNetv2_meddisseg_plan: error: .../nnUNetPlans.json not found": _command("plan", plan_rows.plan_not_preprocessed),
    "have no '2d' configuration": _command("plan", plan_rows.plan_3d_only),
    "trains 2D networks only": trainer_3d,
    "--patch_size must be two positive multiples of 16": _command("plan", plan_rows.plan_patch_not_multiple_of_16),
    "encoder weights 'imagenet': ... is not in the cache": imagenet_not_cached,
    "--encoder_weights: encoder weights ...: missing key '...' (expected torchvision resnet50 layout)":
        _command("plan", plan_weights_missing_key),
    "shape mismatch for key '...'": _command("plan", plan_rows.plan_weights_wrong_shapes),
    "nnUNetv2_meddisseg_convert: error: ... already exists: pass --overwrite to replace it or choose another -d":
        _command("convert", convert_rows.conv_dataset_exists),
    "has no mask": _command("convert", convert_rows.conv_image_without_mask),
    "expected the same size": _command("convert", convert_rows.conv_size_mismatch),
    "cannot read image": _command("convert", convert_rows.conv_corrupt_image),
    "nnUNetv2_meddisseg_evaluate: error: prediction folder ... lacks ... cases, first missing: ...":
        _command("evaluate", evaluate_rows.eval_missing_cases),
    "nnUNetv2_meddisseg_evaluate: error: prediction folder ... is empty: expected one ... file per case of the "
    "reference folder ...": _command("evaluate", evaluate_rows.eval_empty_prediction_folder),
    "holds label values {255} outside the declared set {0, 1} (a 0/255 mask? binary labels must be 0/1)":
        _command("evaluate", evaluate_rows.eval_mask_0_255),
    "outside the declared set {0, 1} (the default is binary; for a multi-class dataset declare its labels with "
    "-djfile dataset.json or --labels ...)": _command("evaluate", evaluate_rows.eval_multiclass_undeclared),
    "nnUNetv2_meddisseg_compare: error: no trained model: .../nnUNetTrainer__nnUNetPlans__2d/fold_0/"
    "checkpoint_final.pth not found (train it first, ...)":
        _command("compare", compare_rows.cmp_baseline_model_missing),
    "nnUNetv2_meddisseg_plan: error: .../nnUNetMedDisSegPlans.json exists with other settings (...): pass "
    "--overwrite to replace it": _command("plan", plan_rows.plan_rerun_other_settings),
    "--plans_name must be a name of letters, digits, '_', '.' and '-'": _command("plan", plan_rows.plan_name_is_a_path),
    "--gpu_memory_target must be a finite number of GB above 0": _command("plan", plan_rows.plan_memory_target("nan")),
    "nnUNetv2_meddisseg_plan: error: .../nnUNetPlans.json is not valid JSON":
        _command("plan", plan_rows.plan_truncated_json("nnUNetPlans.json")),
    "holds pickled objects other than tensors, numbers and containers (needs GLOBAL ...); it was not loaded, since "
    "loading such objects can run code": _command("compare", compare_rows.cmp_checkpoint_payload),
    "holds NaN or inf values (expected finite weights)": _command("plan", plan_rows.plan_weights_nan),
    "checkpoint_final.pth is empty (0 bytes)": _command("compare", compare_rows.cmp_zero_byte_checkpoint),
    "is not an nnU-Net checkpoint: it has no ...": _command("compare", compare_rows.cmp_checkpoint_not_nnunet),
    "cannot be read as a checkpoint (truncated or corrupt?": _command("compare", compare_rows.cmp_truncated_checkpoint),
    "mask ... would be written empty: its values reach ... but none exceeds half its range":
        _command("convert", convert_rows.conv_faint_mask),
    "holds the values {0, 128, 255}: 128 covers ... % of the pixels, in the middle of its range (above 63.75, below "
    "191.25), so it is neither faint background nor an anti-aliased edge": three_valued_mask,
    "nnUNetv2_meddisseg_convert: error: ... of ... masks are refused by the mask rule (all listed in the report above)":
        _command("convert", ambiguous_masks),
    "holds the values {...}: ... a label map of ... classes": _command("convert", convert_rows.conv_label_map_mask),
    "holds ... colours of different hues that each cover more than 1 % of the pixels":
        _command("convert", convert_rows.conv_colour_label_map_mask),
    "--mask_threshold must be a number from 0 to below 65535": _command("convert", mask_threshold_negative),
    "--mask_threshold ... is not below the range of mask": _command("convert", mask_threshold_out_of_range),
    "holds NaN or inf values: replace them (e.g. numpy.nan_to_num)": nan_image,
    "--resize must be at least 16 pixels": _command("convert", convert_rows.conv_resize_one),
    "vanishes at ...: choose a larger --resize": foreground_vanishes,
    "-o ... is inside -ref ...": _command("evaluate", evaluate_rows.eval_output_is_a_reference_label),
    "-o ... is inside the input folder ...": _command("compare", compare_rows.cmp_output_inside_test_labels),
    "is inside MODEL_FOLDER": share_inside_model_folder,
    "the dataset this conversion writes (and --overwrite replaces)":
        _command("convert", convert_rows.conv_source_is_the_dataset),
    "nnUNetv2_meddisseg_export: error: -o ... exists and is not an export of nnUNetv2_meddisseg_export (no "
    "onnx_model.json written by it): -o replaces only an earlier export; choose a new folder":
        _command("export", export_rows.exp_output_is_a_user_folder),
    "-o ... is inside nnUNet_raw (...), whose folders belong to nnU-Net":
        _command("export", export_rows.exp_output_in("nnUNet_raw")),
    "--int8 needs nnUNet_preprocessed, which is not set":
        _command("export", export_rows.exp_without_nnunet_preprocessed("--int8")),
    "nnUNetv2_meddisseg_export: error: ... cannot be read as a preprocessed case (truncated or damaged? ...): run "
    "nnUNetv2_preprocess for this configuration again": _command("export", export_rows.exp_truncated_case),
    "splits_final.json: not valid JSON (truncated? ...), expected nnU-Net's list of splits":
        _command("export", export_rows.exp_int8_splits_truncated),
    "splits_final.json: expected nnU-Net's list of splits, one object per fold with lists of case names 'train' and "
    "'val'; got ...": _command("export", export_rows.exp_int8_splits_an_object),
    "splits_final.json has no training cases to calibrate INT8 on":
        _command("export", export_rows.exp_int8_fold_without_training_cases),
    "splits_final.json has no validation cases to verify a reduced precision on":
        _command("export", export_rows.exp_int8_fold_without_validation_cases),
    "-o ... is the input folder -i ...: the predictor never writes into its inputs":
        _command("predict_onnx", predict_rows.pred_output_is_input),
    "(the output of case ...) would overwrite the input file ...":
        _command("predict_onnx", predict_rows.pred_output_file_is_an_input),
    "exists and was not written by nnUNetv2_meddisseg_predict_onnx (or was changed since): pass --overwrite to "
    "replace such files, or choose another -o": _command("predict_onnx", predict_rows.pred_output_not_ours),
    "its sha256 ... is not the ... that onnx_model.json records":
        _command("predict_onnx", predict_rows.pred_graph(lambda: predict_rows.tiny_graph(5), record=False)),
    "model.onnx: empty (0 bytes)": _command("predict_onnx", predict_rows.pred_graph(lambda: b"", record=False)),
    "model.onnx: not an ONNX graph (...)":
        _command("predict_onnx", predict_rows.pred_graph(lambda: predict_rows.tiny_graph(0)[:100], record=True)),
    "OpenVINO cannot load it": _command("predict_onnx", predict_rows.pred_graph(predict_rows.unknown_operator,
                                                                               record=True)),
    "ONNX Runtime cannot load it": _command("predict_onnx", _with_flags(
        predict_rows.pred_graph(predict_rows.unknown_operator, record=True), "--runtime", "onnxruntime")),
    "onnx_model.json: patch_size ... is not what fold_.../model.onnx was exported and checked with (...): the "
    "description was edited; export again":
        _command("predict_onnx", predict_rows.pred_edited(predict_rows._set(patch_size=[32, 32]))),
    "model.onnx: carries no record of the fields it was exported and checked with (...)":
        _command("predict_onnx", predict_rows.pred_graph(lambda: predict_rows.traced_graph(0), record=True)),
    "the graph's output has ... segmentation heads, onnx_model.json says ...": _command(
        "predict_onnx", predict_rows.pred_graph(lambda: predict_rows.tiny_graph(0, out_channels=3), record=True)),
    "onnx_model.json: patch_size must be two integers from 1 to 4096 (a 2D patch), got ...":
        _command("predict_onnx", predict_rows.pred_field("patch_size", [0, 16])),
    "--precision int8: fold ... was not verified in int8 at export (export it with nnUNetv2_meddisseg_export --int8)":
        _command("predict_onnx", _with_flags(lambda tmp, env: predict_rows._model_and_cases(tmp), "--precision",
                                             "int8")),
    "format version 1, this predictor reads 2: export the model again":
        _command("predict_onnx", predict_rows.pred_field("format_version", 1)),
    "reads as an array of shape ..., expected a 2D grey, RGB or RGBA image":
        _command("predict_onnx", predict_rows.pred_grey_with_alpha),
    "NaN and ... infinite pixel(s) of ...: the model cannot predict undefined values":
        _command("predict_onnx", predict_rows.pred_float_tiff(float("nan"))),
    "-part_id must be from 0 to ... (-num_parts ...; parts count from 0), got ...":
        _command("predict_onnx", predict_rows.pred_parts("-num_parts", "3", "-part_id", "3")),
    "nnUNetv2_train: error: cannot read the checkpoint .../checkpoint_latest.pth (truncated or corrupt? ...): copy "
    ".../checkpoint_best.pth over it to resume from the best epoch, or train again without --c":
        truncated_checkpoint_latest,
    "nnUNetv2_train: error: nnUNet_meddisseg_seed must be an integer >= 0, got '...'": seed_not_a_number,
    "nnUNetv2_meddisseg_plan: error: --recipe ...: cannot read the recipe file: ...":
        _command("plan", plan_rows.plan_recipe(None)),
    "nnUNetv2_meddisseg_plan: error: --recipe ...: not a JSON file of recipe settings (...)":
        _command("plan", plan_rows.plan_recipe('{"num_epochs": ')),
    "nnUNetv2_meddisseg_plan: error: --recipe ...: unknown setting '...' for MedDisSegRecipe (known: ...)":
        _command("plan", plan_rows.plan_recipe('{"num_epoch": 20}')),
    "nnUNetv2_train: error: plans ...: meddisseg_recipe: unknown setting '...' for MedDisSegRecipe (known: ...)":
        plans_recipe_unknown_setting,
    "nnUNetv2_train: error: encoder weights file not found: ... (the plans' encoder_weights)": encoder_weights_not_here,
    "DDP training (triggered by num_gpus > 1) is only implemented for cuda devices. Your device: cpu": ddp_on_cpu,
    "nnUNetv2_train: error: input with NaN or inf values in a training batch": nan_batch,
    "WARNING: a training batch holds a single sample: the dispersive loss needs at least two samples":
        single_sample_batch,
    "WARNING: the dispersive loss (...) sees ... sample(s) per step but needs at least ...": dispersive_batch_too_small,
    "WARNING: no training step of epoch ... changed the weights: every gradient was zero or not finite":
        no_gradient_epoch,
}

# quoted in the table but not triggered here, with the reason
NOT_TRIGGERED: Dict[str, str] = {
    "--precision bf16: this CPU has no native bf16 (...); use fp32 or int8":
        "needs a CPU without native bf16; tests/deploy/test_predict_onnx.py simulates one",
    "fold ...: int8 misses the bounds unless every block stays in fp32 (...): nothing written":
        "needs a trained model; tests/e2e/test_onnx_deploy.py sets a bound no model meets",
    "WARNING: torch.compile failed (...); training continues without compilation":
        "trains through a compiled trainer; tests/training/test_trainer_compile.py forces a compile error and reads "
        "this line from the training log",
    "the fused CDFA kernels failed on this GPU (...)": "needs a GPU whose Triton cannot build the kernels; "
                                                        "tests/blocks/test_kernel_fallbacks.py simulates one",
    "the TeLU Triton kernel failed on this GPU (...)":
        "as the fused CDFA kernels: tests/blocks/test_kernel_fallbacks.py",
    "operator torchvision::nms does not exist": "needs a torch / torchvision pair that do not match (a broken install)",
    "--encoder_weights imagenet: cannot download torchvision's ResNet-50 IMAGENET1K_V1 weights":
        "needs a failed download, and tests never touch the network",
    "ProcessGroupNCCL is only supported with GPUs, no GPUs found!":
        "torch's NCCL process group on a machine without a CUDA GPU (nnU-Net's -num_gpus start, in processes it "
        "spawns before any trainer of ours is loaded); the -device cpu form of that mistake is triggered above",
    "Distributed package doesn't have NCCL built in": "as the line above, with a torch built without NCCL",
    "cannot write ...: No space left on device": "needs a full disk; tests/datasets/test_convert_error_table.py and "
                                                   "tests/evaluation/test_evaluate_error_table.py simulate one, "
                                                   "tests/test_sharing.py for weights_only, "
                                                   "tests/deploy/test_export_folder.py for the export",
}

# quotes in the first column that name a command or variable rather than a message
NOT_MESSAGES = {"nnUNetv2_train", "nnUNetv2_predict"}


def _appears_in_order(quote: str, output: str) -> bool:
    position = 0
    for piece in (p.strip() for p in quote.split("...")):
        if not piece:
            continue
        found = output.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def test_every_quote_is_triggered_or_listed_with_a_reason():
    table = (ROOT / "docs" / "troubleshooting.md").read_text()
    quotes = [q for q in troubleshooting_quotes(table) if q not in NOT_MESSAGES]
    assert len(quotes) >= 15
    assert not set(TRIGGERS) & set(NOT_TRIGGERED)
    assert sorted(quotes) == sorted({*TRIGGERS, *NOT_TRIGGERED}), \
        "docs/troubleshooting.md's table and this test disagree"


def test_quote_matching_needs_every_piece_in_order():
    assert _appears_in_order("a ... c", "a b c")
    assert not _appears_in_order("a ... c", "c b a")
    assert not _appears_in_order("a ... d", "a b c")


@pytest.mark.parametrize("quote", list(TRIGGERS), ids=[q[:40] for q in TRIGGERS])
def test_quoted_message_is_what_the_tool_prints(quote, tmp_path, nnunet_dirs, monkeypatch):
    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    work = tmp_path / "work"
    work.mkdir()
    output = TRIGGERS[quote](work, nnunet_dirs)
    assert _appears_in_order(quote, " ".join(output.split())), f"{quote!r} not in the real output:\n{output}"
