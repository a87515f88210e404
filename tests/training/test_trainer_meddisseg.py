"""nnUNetTrainerMedDisSeg and nnUNetTrainerDispersive on tiny in-memory batches (no dataloaders).

The trainers are built from a hand-written 32x32 plan; batches are fed to the same hooks nnU-Net's
``run_training`` calls, so stages, optimizer groups, schedules and checkpoints are exercised
without preprocessing a dataset.
"""
import json
import math
from copy import deepcopy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.losses import foreground_background_loss
from nnunetv2_meddisseg.training import dispersion_monitor
from nnunetv2_meddisseg.training.errors import (
    TrainingInputError,
    TrainingInputRuntimeError,
)
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.objectives import foreground_target
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_100epochs, nnUNetTrainerMedDisSeg_smoke

DATASET = "Dataset999_Tiny"  # the preprocessed folder conftest.py makes (nnunet_dirs)
PLAIN_UNET = {
    "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "arch_kwargs": {"n_stages": 3, "features_per_stage": [4, 8, 16], "conv_op": "torch.nn.modules.conv.Conv2d",
                    "kernel_sizes": [[3, 3]] * 3, "strides": [[1, 1], [2, 2], [2, 2]], "n_conv_per_stage": [1, 1, 1],
                    "n_conv_per_stage_decoder": [1, 1], "conv_bias": True,
                    "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
                    "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
                    "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
    "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
}
MEDDISSEG = {
    "network_class_name": "nnunetv2_meddisseg.architectures.MedDisSegNet",
    "arch_kwargs": {"encoder_weights": None, "elat": False, "activation": "relu", "decoder_fusion": "sum",
                    "conv_op": "torch.nn.modules.conv.Conv2d", "norm_op": "torch.nn.modules.batchnorm.BatchNorm2d",
                    "norm_op_kwargs": {"eps": 1e-5, "affine": True}},
    "_kw_requires_import": ["conv_op", "norm_op"],
}
DATASET_JSON = {"channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "a": 1, "b": 2},
                "numTraining": 4, "file_ending": ".png"}


def tiny_plans(architecture=PLAIN_UNET, patch_size=(32, 32), configuration="2d") -> dict:
    resampling = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    return {
        "dataset_name": DATASET, "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": [999.0, 1.0, 1.0],
        "original_median_shape_after_transp": [1, 32, 32], "image_reader_writer": "NaturalImage2DIO",
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
        "experiment_planner_used": "ExperimentPlanner", "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": {},
        "configurations": {configuration: {
            "data_identifier": "nnUNetPlans_2d", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
            "patch_size": list(patch_size), "median_image_size_in_voxels": list(patch_size),
            "spacing": [1.0] * len(patch_size), "normalization_schemes": ["ZScoreNormalization"] * 3,
            "use_mask_for_norm": [False] * 3, "resampling_fn_data": "resample_data_or_seg_to_shape",
            "resampling_fn_seg": "resample_data_or_seg_to_shape", "resampling_fn_data_kwargs": resampling,
            "resampling_fn_seg_kwargs": resampling, "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
            "resampling_fn_probabilities_kwargs": resampling, "architecture": deepcopy(architecture),
            "batch_dice": True,
        }},
    }


def make_trainer(cls=nnUNetTrainerMedDisSeg_smoke, plans=None, initialize=True, dataset_json=DATASET_JSON,
                 **attributes):
    """A trainer of ``cls`` on the tiny plans; ``attributes``: recipe settings and class attributes of a variant
    (a subclass of ``cls`` of the same name, as a one-line variant gives them), and other instance attributes."""
    plans = deepcopy(plans if plans is not None else tiny_plans())
    plans["continue_training"] = False
    settings = {k: v for k, v in attributes.items() if k in cls.recipe.field_names()}
    declared = {k: v for k, v in attributes.items() if k not in settings and hasattr(cls, k)}
    if settings or declared:
        cls = type(cls.__name__, (cls,), {"recipe": replace(cls.recipe, **settings), **declared})
    trainer = cls(plans=plans, configuration="2d", fold=0, dataset_json=deepcopy(dataset_json),
                  device=torch.device("cpu"))
    for name, value in attributes.items():
        if name not in settings and name not in declared:
            setattr(trainer, name, value)
    if hasattr(trainer, "_draw_batchnorm_calibration_batches"):  # no preprocessed dataset to draw from
        patch = trainer.configuration_manager.patch_size
        trainer._draw_batchnorm_calibration_batches = lambda: [
            torch.randn(2, trainer.num_input_channels, *patch, generator=torch.Generator().manual_seed(1))]
    if initialize:
        trainer.initialize()
    return trainer


def make_batch(b=2, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.zeros(b, 1, size, size)
    target[:, :, 4:14, 4:14] = 1
    target[:, :, 18:28, 16:30] = 2
    return {"data": torch.randn(b, 3, size, size, generator=g), "target": target,
            "keys": [f"case_{i:03d}" for i in range(b)]}


def group_ids(trainer):
    return {g["name"]: [id(p) for p in g["params"]] for g in trainer.optimizer.param_groups}


def run_epoch(trainer, batch):
    """One epoch the way nnUNetTrainer.run_training runs it, with one given batch."""
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    outputs = [trainer.train_step(batch)]
    trainer.on_train_epoch_end(outputs)
    with torch.no_grad():
        trainer.on_validation_epoch_start()
        trainer.on_validation_epoch_end([trainer.validation_step(batch)])
    trainer.on_epoch_end()
    return outputs[0]


# ---------------------------------------------------------------------------------------- construction
def test_3d_configuration_is_refused_before_anything_is_written(nnunet_dirs):
    plans = tiny_plans(patch_size=(16, 32, 32), configuration="3d_fullres")
    plans["continue_training"] = False
    with pytest.raises(TrainingInputError, match=r"2D networks only.*'3d_fullres'.*-c 2d"):  # a ValueError
        nnUNetTrainerMedDisSeg(plans, "3d_fullres", 0, deepcopy(DATASET_JSON), torch.device("cpu"))
    assert not (nnunet_dirs / "results").exists()


def test_default_stage1_length_is_a_quarter(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg, initialize=False)
    assert (trainer.num_epochs, trainer.stage1_epochs) == (1000, 250)


def test_stage1_epochs_follows_the_variants_num_epochs(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_100epochs, initialize=False)
    assert (trainer.num_epochs, trainer.stage1_epochs) == (100, 25)
    assert make_trainer(nnUNetTrainerMedDisSeg_100epochs, initialize=False, stage1_epochs=7).stage1_epochs == 7


def test_network_from_default_plans_and_from_meddisseg_plans():
    for architecture, elat_is_identity in ((PLAIN_UNET, False), (MEDDISSEG, True)):
        plans_manager = PlansManager(tiny_plans(architecture))
        network = nnUNetTrainerMedDisSeg.build_network_architecture(
            plans_manager, plans_manager.get_configuration("2d"), 3, 3, enable_deep_supervision=False)
        assert isinstance(network, MedDisSegNet)
        assert isinstance(network.elat[0], torch.nn.Identity) == elat_is_identity
        out = network.eval()(torch.zeros(1, 3, 32, 32))
        assert out.shape == (1, 3, 32, 32)


def test_network_on_nnunets_plans_is_what_the_plan_command_writes_by_default():
    from nnunetv2_meddisseg.plans_architecture import ADDED_NORMS, DEFAULT_ADDED_NORM

    plans_manager = PlansManager(tiny_plans(PLAIN_UNET))
    network = nnUNetTrainerMedDisSeg.build_network_architecture(plans_manager, plans_manager.get_configuration("2d"),
                                                                3, 3, enable_deep_supervision=True)
    added_op, added_kwargs = ADDED_NORMS[DEFAULT_ADDED_NORM]
    assert f"{network.added_norm[0].__module__}.{network.added_norm[0].__name__}" == added_op
    assert network.added_norm[1] == added_kwargs
    encoder = set(network.encoder.modules())
    assert not [m for m in network.modules() if getattr(m, "track_running_stats", False) and m not in encoder]


def test_on_nnunets_plans_the_trainer_records_the_network_it_builds(nnunet_dirs):
    """The plans a model keeps (``plans.json`` is ``plans_manager.plans``; the checkpoints' ``init_args``)
    name MedDisSegNet with every argument, so prediction rebuilds the trained network whatever the code's
    defaults; everything else stays nnU-Net's plans, and the caller's plans are not changed."""
    from nnunetv2_meddisseg.plans_architecture import architecture_entry

    plans = dict(tiny_plans(PLAIN_UNET), continue_training=False)
    before = deepcopy(plans)
    trainer = nnUNetTrainerMedDisSeg_smoke(plans=plans, configuration="2d", fold=0, dataset_json=deepcopy(DATASET_JSON),
                                           device=torch.device("cpu"))
    assert plans == before
    recorded = trainer.plans_manager.plans
    assert recorded["configurations"]["2d"]["architecture"] == architecture_entry()
    assert trainer.my_init_kwargs["plans"] is recorded
    for key in ("patch_size", "batch_size", "normalization_schemes"):
        assert recorded["configurations"]["2d"][key] == plans["configurations"]["2d"][key]
    trainer.initialize()
    saved = PlansManager(json.loads(json.dumps(recorded)))  # as plans.json is written and read
    rebuilt = nnUNetTrainerMedDisSeg.build_network_architecture(saved, saved.get_configuration("2d"), 3, 3, True)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == \
        {k: v.shape for k, v in trainer._plain_network().state_dict().items()}
    meddisseg_plans = tiny_plans(MEDDISSEG)
    kept = make_trainer(plans=meddisseg_plans, initialize=False).plans_manager.plans
    assert kept["configurations"] == meddisseg_plans["configurations"]  # Med-DisSeg plans are kept as they are


def test_network_class_is_meddisseg_reads_the_class_not_the_plans_name():
    from nnunetv2_meddisseg.training.network_from_plans import network_class_is_meddisseg

    def configuration(architecture, plans_name):
        plans = tiny_plans(architecture)
        plans["plans_name"] = plans_name
        return PlansManager(plans).get_configuration("2d")

    assert network_class_is_meddisseg(configuration(MEDDISSEG, "nnUNetPlans"))
    assert not network_class_is_meddisseg(configuration(PLAIN_UNET, "nnUNetMedDisSegPlans"))
    subclass = {**MEDDISSEG, "network_class_name": f"{__name__}.{SubclassedNet.__name__}"}
    assert network_class_is_meddisseg(configuration(subclass, "anything"))


class SubclassedNet(MedDisSegNet):
    """A network class derived from MedDisSegNet (``network_class_is_meddisseg``)."""


def test_prediction_build_does_not_need_the_encoder_weights_file(nnunet_dirs, tmp_path):
    architecture = deepcopy(MEDDISSEG)
    architecture["arch_kwargs"]["encoder_weights"] = str(tmp_path / "resnet50_on_the_training_machine.pth")
    plans_manager = PlansManager(tiny_plans(architecture))
    configuration = plans_manager.get_configuration("2d")
    # nnU-Net's predictor builds through the static method (with or without deep supervision), then loads
    # the checkpoint's weights; it never calls initialize
    for deep_supervision in (False, True):
        network = nnUNetTrainerMedDisSeg.build_network_architecture(plans_manager, configuration, 3, 3,
                                                                    deep_supervision)
        assert isinstance(network, MedDisSegNet)
    trainer = make_trainer(plans=tiny_plans(architecture), initialize=False)
    with pytest.raises(TrainingInputError, match="resnet50_on_the_training_machine"):  # training reads it
        trainer.initialize()


# ---------------------------------------------------------------------------------------- stages
def test_stage1_optimizer_holds_head_and_encoder(nnunet_dirs):
    trainer = make_trainer()
    network = trainer.network
    assert trainer.training_stage == STAGE_1
    assert [g["name"] for g in trainer.optimizer.param_groups] == ["head", "encoder"]
    ids = group_ids(trainer)
    assert ids["head"] == [id(p) for p in trainer.stage1_head.parameters()]
    assert ids["encoder"] == [id(p) for p in network.encoder_parameters()]
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-4, 1e-4]


def test_stage_switch_groups_and_per_group_schedule(nnunet_dirs):
    trainer = make_trainer(num_epochs=8, stage1_epochs=2)
    network = trainer.network
    encoder_ids = {id(p) for p in network.encoder.parameters()} | {id(p) for p in network.elat.parameters()}
    seen = []
    for epoch in range(8):
        trainer.current_epoch = epoch
        trainer.on_train_epoch_start()
        seen.append([g["lr"] for g in trainer.optimizer.param_groups])
        if epoch == 2:
            assert trainer.training_stage == STAGE_2
            assert trainer.stage1_head is None and trainer._best_ema is None
            ids = group_ids(trainer)
            everything = [id(p) for p in network.parameters()]
            grouped = ids["decoder"] + ids["encoder"]
            assert sorted(grouped) == sorted(everything)  # every parameter in exactly one group
            assert len(set(grouped)) == len(grouped)
            assert set(ids["encoder"]) == encoder_ids
    for epoch in range(2):
        expected = 1e-4 * (1 - epoch / 2) ** 0.9
        assert seen[epoch] == pytest.approx([expected, expected])
    for epoch in range(2, 8):
        factor = (1 - (epoch - 2) / 6) ** 0.9
        assert seen[epoch] == pytest.approx([1e-4 * factor, 1e-5 * factor])
    assert trainer.logger.get_value("lr_encoder", step=None)[3] == pytest.approx(1e-5 * (1 - 1 / 6) ** 0.9)
    assert trainer.logger.get_value("stage", step=None) == [1, 1, 2, 2, 2, 2, 2, 2]


def test_train_steps_update_the_right_parameters(nnunet_dirs):
    torch.manual_seed(0)
    trainer = make_trainer()
    network = trainer.network
    batch = make_batch()
    encoder_before = network.encoder.conv1.weight.detach().clone()
    decoder_param = next(network.decoder.parameters())
    decoder_before = decoder_param.detach().clone()

    trainer.on_train_epoch_start()
    out = trainer.train_step(batch)
    assert {"loss_seg", "loss_seg_perturbed", "loss_consistency", "loss_dispersive"} <= out.keys()
    assert math.isfinite(float(out["loss"])) and out["loss_dispersive"] < 0  # log of a mean of exp(-d) < 1
    expected = (out["loss_seg"] + out["loss_seg_perturbed"] + out["loss_consistency"]
                + 0.2 * out["loss_dispersive"])
    assert float(out["loss"]) == pytest.approx(expected, rel=1e-5)
    assert out["dispersion_effective_rank"] > 0 and out["dispersion_mean_pairwise_distance"] > 0
    assert not torch.equal(network.encoder.conv1.weight, encoder_before)
    assert torch.equal(decoder_param, decoder_before)  # Stage I never touches the decoder

    trainer.current_epoch = 1
    trainer.on_train_epoch_start()
    out = trainer.train_step(batch)
    assert {"loss_seg", "loss_seg_paths", "loss_fg_bg", "loss_complementarity", "loss_dispersive"} <= out.keys()
    expected = (out["loss_seg"] + 0.5 * out["loss_seg_paths"] + out["loss_fg_bg"] + out["loss_complementarity"]
                + 0.6 * out["loss_dispersive"])
    assert float(out["loss"]) == pytest.approx(expected, rel=1e-5)
    assert not torch.equal(decoder_param, decoder_before)

    with torch.no_grad():
        trainer.on_validation_epoch_start()
        val = trainer.validation_step(batch)
    assert val["tp_hard"].shape == (2,)  # two foreground classes
    assert math.isfinite(float(val["loss"]))


def test_foreground_target_is_any_foreground_class():
    target = torch.tensor([0.0, 1.0, 2.0, 3.0]).view(1, 1, 2, 2)
    foreground, mask = foreground_target(target)
    assert foreground.flatten().tolist() == [0.0, 1.0, 1.0, 1.0] and mask is None
    foreground, mask = foreground_target(target, ignore_label=3)
    assert foreground.flatten().tolist() == [0.0, 1.0, 1.0, 0.0]
    assert mask.flatten().tolist() == [1.0, 1.0, 1.0, 0.0]


def test_stage2_fg_bg_term_leaves_the_ignore_label_out(nnunet_dirs, monkeypatch):
    # a fixed run seed: with some initialisations the unlabelled rows change the loss by less than the guard below
    monkeypatch.setenv("nnUNet_meddisseg_seed", "0")
    torch.manual_seed(0)
    dataset_json = deepcopy(DATASET_JSON)
    dataset_json["labels"]["ignore"] = 3
    trainer = make_trainer(dataset_json=dataset_json)
    trainer.current_epoch = 1
    trainer.on_train_epoch_start()
    assert trainer.training_stage == STAGE_2
    batch = make_batch()
    batch["target"][:, :, 20:32, :] = 3  # rows without a label
    with torch.no_grad():  # train mode: the same output as the step's forward
        output = trainer.network(batch["data"], output="all")
    labelled = (batch["target"] != 3).float()
    expected = foreground_background_loss(output.fg, output.bg, ((batch["target"] > 0) & (labelled > 0)).float(),
                                          labelled)
    as_background = foreground_background_loss(output.fg, output.bg, ((batch["target"] > 0) & (labelled > 0)).float())
    as_foreground = foreground_background_loss(output.fg, output.bg, (batch["target"] > 0).float())
    out = trainer.train_step(batch)
    assert out["loss_fg_bg"] == pytest.approx(expected.item(), rel=1e-5)
    for wrong in (as_background, as_foreground):  # the test can tell the ignore label's two wrong readings apart
        assert abs(expected.item() - wrong.item()) > 1e-2


def test_nan_input_is_a_clear_error(nnunet_dirs):
    trainer = make_trainer()
    trainer.on_train_epoch_start()
    batch = make_batch()
    batch["data"][1, 0, 3, 3] = float("nan")
    weights_before = trainer.network.encoder.conv1.weight.detach().clone()
    with pytest.raises(TrainingInputRuntimeError, match=r"NaN or inf.*training batch of epoch 0: case_001\."):
        trainer.train_step(batch)
    assert torch.equal(trainer.network.encoder.conv1.weight, weights_before)
    with pytest.raises(TrainingInputRuntimeError, match="validation batch"):
        trainer.validation_step(batch)


def test_batch_size_one_warns_once_and_has_zero_dispersion(nnunet_dirs):
    trainer = make_trainer()
    trainer.on_train_epoch_start()
    outputs = [trainer.train_step(make_batch(b=1, seed=s)) for s in range(2)]
    assert all(o["loss_dispersive"] == 0.0 for o in outputs)
    assert all(math.isfinite(float(o["loss"])) for o in outputs)
    log = Path(trainer.log_file).read_text()
    assert log.count("single sample") == 1


# ---------------------------------------------------------------------------------------- checkpoints
def test_resuming_from_a_checkpoint_of_another_trainer_names_the_file(nnunet_dirs):
    trainer = make_trainer()
    for entries, message in (
            ({}, "it records no Med-DisSeg stage ('meddisseg_stage'): not a checkpoint of this trainer"),
            ({"meddisseg_stage": "stage3"},
             "it records an unknown Med-DisSeg stage 'stage3' (expected 'stage1' or 'stage2'): not a checkpoint of "
             "this trainer"),
            ({"meddisseg_stage": STAGE_1},
             "a Stage I checkpoint without 'stage1_head_weights' cannot be resumed: not a checkpoint of this trainer")):
        file = nnunet_dirs / "checkpoint_latest.pth"
        torch.save({"network_weights": {}, **entries}, file)
        with pytest.raises(TrainingInputRuntimeError) as error:  # a RuntimeError; nnUNetv2_train prints one line
            trainer.load_checkpoint(str(file))
        assert str(error.value) == f"checkpoint {file}: {message}"


def test_checkpoint_round_trip_in_stage1_and_stage2(nnunet_dirs):
    torch.manual_seed(0)
    batch = make_batch()
    trainer = make_trainer()
    trainer.on_train_epoch_start()
    trainer.train_step(batch)
    stage1_file = str(nnunet_dirs / "stage1.pth")
    trainer.run_seed = 123
    trainer.save_checkpoint(stage1_file)

    resumed = make_trainer()
    assert resumed.run_seed != 123  # drawn at random (1 in 2**32 to fail)
    with torch.no_grad():  # make sure loading really overwrites
        for p in resumed.stage1_head.parameters():
            p.add_(1.0)
    resumed.load_checkpoint(stage1_file)
    assert resumed.training_stage == STAGE_1
    assert resumed.current_epoch == 1 and resumed.run_seed == 123
    for a, b in zip(trainer.stage1_head.state_dict().values(), resumed.stage1_head.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(trainer.network.state_dict().values(), resumed.network.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.optimizer.state_dict()["state"][0]["step"] == 1
    assert [g["name"] for g in resumed.optimizer.param_groups] == ["head", "encoder"]
    # epoch 1 of the smoke schedule is Stage II: the resumed trainer switches there
    resumed.on_train_epoch_start()
    assert resumed.training_stage == STAGE_2 and resumed.stage1_head is None
    resumed.train_step(batch)
    stage2_file = str(nnunet_dirs / "stage2.pth")
    resumed.save_checkpoint(stage2_file)

    checkpoint = torch.load(stage2_file, weights_only=False)
    assert checkpoint["meddisseg_stage"] == STAGE_2 and "stage1_head_weights" not in checkpoint
    again = make_trainer()
    again.load_checkpoint(stage2_file)
    assert again.training_stage == STAGE_2 and again.stage1_head is None
    assert [g["lr"] for g in again.optimizer.param_groups] == pytest.approx([1e-4, 1e-5])
    for a, b in zip(resumed.network.state_dict().values(), again.network.state_dict().values()):
        assert torch.equal(a, b)

    # prediction rebuilds the bare network and loads the weights strictly, from either stage's checkpoint
    again.network.load_state_dict(torch.load(stage1_file, weights_only=False)["network_weights"])
    again.network.load_state_dict(checkpoint["network_weights"])


def test_smoke_schedule_writes_stage_checkpoints_and_best_only_in_stage2(nnunet_dirs):
    torch.manual_seed(0)
    trainer = make_trainer()
    folder = Path(trainer.output_folder)
    batch = make_batch()
    run_epoch(trainer, batch)  # Stage I
    assert (folder / "checkpoint_latest.pth").is_file()
    assert not (folder / "checkpoint_best.pth").exists()
    latest = torch.load(folder / "checkpoint_latest.pth", weights_only=False)
    assert latest["meddisseg_stage"] == STAGE_1 and latest["current_epoch"] == 1
    assert "stage1_head_weights" in latest and latest["_best_ema"] is None
    assert not (folder / "checkpoint_stage1.pth").exists()  # only where the recipe sets stage1_checkpoint
    run_epoch(trainer, batch)  # Stage II
    assert (folder / "checkpoint_best.pth").is_file()
    assert torch.load(folder / "checkpoint_best.pth", weights_only=False)["meddisseg_stage"] == STAGE_2
    assert (folder / "progress.png").is_file() and (folder / "progress_terms.png").is_file()
    curves = trainer.logger.local_logger
    assert curves.get_value("stage", step=None) == [1, 2]
    assert math.isnan(curves.get_value("loss_fg_bg", 0)) and math.isfinite(curves.get_value("loss_fg_bg", 1))
    assert all(math.isfinite(v) for v in curves.get_value("dispersion_effective_rank", step=None))
    assert not list(folder.glob("*.tmp"))


def test_stage1_checkpoint_keeps_the_model_at_the_end_of_stage1(nnunet_dirs):
    trainer = make_trainer(stage1_checkpoint=True, num_epochs=3, stage1_epochs=2, save_every=2)
    folder = Path(trainer.output_folder)
    batch = make_batch()
    run_epoch(trainer, batch)
    assert not (folder / "checkpoint_stage1.pth").exists()
    run_epoch(trainer, batch)  # the last Stage I epoch, also a periodic checkpoint_latest.pth
    stage1 = torch.load(folder / "checkpoint_stage1.pth", weights_only=False)
    assert stage1["meddisseg_stage"] == STAGE_1 and stage1["current_epoch"] == 2
    assert torch.load(folder / "checkpoint_latest.pth", weights_only=False)["current_epoch"] == 2


# ---------------------------------------------------------------------------------------- Dispersive
def test_dispersive_trainer_adds_the_loss_on_the_first_stage(nnunet_dirs):
    torch.manual_seed(0)
    trainer = make_trainer(nnUNetTrainerDispersive, plans=tiny_plans(PLAIN_UNET))
    trainer.on_train_epoch_start()
    # nnU-Net's default network, default deep-supervision targets (full resolution + 1/2)
    batch = make_batch()
    batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    out = trainer.train_step(batch)
    assert out["loss_dispersive"] < 0 and math.isfinite(out["loss_dispersive"])
    assert float(out["loss"]) == pytest.approx(out["loss_seg"] + 0.2 * out["loss_dispersive"], rel=1e-5)
    assert type(trainer.optimizer).__name__ == "SGD"  # nnU-Net's training otherwise
    with torch.no_grad():
        trainer.on_validation_epoch_start()
        trainer.validation_step(batch)
    assert trainer._captured == []  # the hook only captures in training mode


def test_dispersive_margin_and_eps_are_trainer_settings(nnunet_dirs):
    trainer = make_trainer(dispersive_variant="hinge", dispersive_margin=3.0, dispersive_eps=0.5)
    assert (trainer.dispersive.variant, trainer.dispersive.margin, trainer.dispersive.eps) == ("hinge", 3.0, 0.5)
    # nnUNetTrainerDispersive: eps 1 makes the InfoNCE loss log(mean exp(-d / tau) + 1) > 0 (< 0 with eps 1e-8)
    torch.manual_seed(0)
    dispersive = make_trainer(nnUNetTrainerDispersive, plans=tiny_plans(PLAIN_UNET), dispersive_eps=1.0)
    dispersive.on_train_epoch_start()
    batch = make_batch()
    batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    out = dispersive.train_step(batch)
    assert 0 < out["loss_dispersive"] <= math.log(2)


def test_dispersion_diagnostics_once_per_epoch(nnunet_dirs, monkeypatch):
    calls = []
    real = dispersion_monitor.dispersion_diagnostics
    monkeypatch.setattr(dispersion_monitor, "dispersion_diagnostics", lambda f: calls.append(tuple(f.shape)) or real(f))
    torch.manual_seed(0)
    trainer = make_trainer()
    batch = make_batch()
    for epoch in range(2):  # Stage I, then Stage II
        trainer.current_epoch = epoch
        trainer.on_epoch_start()  # the diagnostics are due again from here (as nnU-Net's loop calls it)
        trainer.on_train_epoch_start()
        outputs = [trainer.train_step(batch) for _ in range(3)]
        assert len(calls) == epoch + 1
        first = outputs[0]["dispersion_effective_rank"]
        assert math.isfinite(first) and all(math.isnan(o["dispersion_effective_rank"]) for o in outputs[1:])
        trainer.on_train_epoch_end(outputs)
        assert trainer.logger.get_value("dispersion_effective_rank", step=epoch) == pytest.approx(first)


def _epoch_with_pseudo_dice(trainer, dice):
    """One epoch through nnU-Net's hooks without training: validation reports pseudo Dice ``dice`` for
    both foreground classes (tp / (tp + fn) with fp = fn)."""
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    trainer.on_train_epoch_end([{"loss": np.array(0.5)}])
    trainer.on_validation_epoch_start()
    tp, fn = np.array([100 * dice] * 2), np.array([100 * (1 - dice)] * 2)
    trainer.on_validation_epoch_end([{"loss": np.array(0.5), "tp_hard": tp, "fp_hard": fn, "fn_hard": fn}])
    trainer.on_epoch_end()


def test_checkpoint_best_holds_the_stage2_network_whose_own_ema_won(nnunet_dirs):
    trainer = make_trainer(num_epochs=5, stage1_epochs=2)
    best = Path(trainer.output_folder) / "checkpoint_best.pth"
    for dice in (0.9, 0.9):  # the Stage I head scores high
        _epoch_with_pseudo_dice(trainer, dice)
    assert not best.exists()
    # Stage II: EMA restarted at its first epoch -> 0.1, 0.9 * 0.1 + 0.1 * 0.5 = 0.14, 0.9 * 0.14 + 0.06 = 0.186,
    # a new best every epoch. Continued from Stage I the EMA would be 0.82, 0.788, 0.7692: epoch 2 would stay best.
    for epoch, dice, ema in ((2, 0.1, 0.1), (3, 0.5, 0.14), (4, 0.6, 0.186)):
        _epoch_with_pseudo_dice(trainer, dice)
        checkpoint = torch.load(best, weights_only=False)
        assert checkpoint["meddisseg_stage"] == STAGE_2
        assert checkpoint["current_epoch"] == epoch + 1 and checkpoint["_best_ema"] == pytest.approx(ema)
    assert trainer.logger.get_value("ema_fg_dice", step=None) == pytest.approx([0.9, 0.9, 0.1, 0.14, 0.186])


def test_stage1_epochs_neither_write_best_nor_leave_a_false_best_ema_in_checkpoints(nnunet_dirs):
    trainer = make_trainer(num_epochs=5, stage1_epochs=2, save_every=1)
    folder = Path(trainer.output_folder)
    _epoch_with_pseudo_dice(trainer, 0.9)  # Stage I: nnU-Net's on_epoch_end writes checkpoint_latest.pth
    assert not (folder / "checkpoint_best.pth").exists() and trainer._best_ema is None
    assert torch.load(folder / "checkpoint_latest.pth", weights_only=False)["_best_ema"] is None
    _epoch_with_pseudo_dice(trainer, 0.9)
    _epoch_with_pseudo_dice(trainer, 0.3)  # first Stage II epoch: the best so far, 0.3 (EMA restarted)
    assert trainer._best_ema == pytest.approx(0.3)
    assert torch.load(folder / "checkpoint_best.pth", weights_only=False)["_best_ema"] == pytest.approx(0.3)
    _epoch_with_pseudo_dice(trainer, 0.1)  # EMA 0.28: no new best; latest records the best so far
    assert torch.load(folder / "checkpoint_latest.pth", weights_only=False)["_best_ema"] == pytest.approx(0.3)


def test_the_log_names_weights_that_pretrained_weights_loaded(nnunet_dirs, tmp_path):
    """nnU-Net's -pretrained_weights loads a file between initialize and on_train_start without telling the
    trainer; the log line on the encoder's origin must not say "random initialisation" then."""
    from nnunetv2.run.load_pretrained_weights import load_pretrained_weights

    trainer = make_trainer()
    assert trainer._encoder_origin() == "random initialisation"
    other = make_trainer(initialize=False)
    torch.manual_seed(123)
    other.initialize()
    torch.save({"network_weights": other.network.state_dict()}, tmp_path / "pretrained.pth")
    load_pretrained_weights(trainer.network, str(tmp_path / "pretrained.pth"))
    assert trainer._encoder_origin().startswith("the weights -pretrained_weights loaded")
    trainer.current_epoch = 3  # resumed from a checkpoint (--c): the weights are the run's own
    assert trainer._encoder_origin() == "random initialisation"


def test_stage1_head_uses_the_norm_of_the_added_blocks(nnunet_dirs):
    from torch.nn.modules.batchnorm import _NormBase

    architecture = deepcopy(MEDDISSEG)
    architecture["arch_kwargs"].update(added_norm_op="torch.nn.modules.instancenorm.InstanceNorm2d",
                                       added_norm_op_kwargs={"eps": 1e-5, "affine": True})
    architecture["_kw_requires_import"].append("added_norm_op")
    trainer = make_trainer(plans=tiny_plans(architecture))
    assert trainer.training_stage == STAGE_1
    norms = {type(m) for m in trainer.stage1_head.modules() if isinstance(m, _NormBase)}
    assert norms == {torch.nn.InstanceNorm2d}
    default = make_trainer(plans=tiny_plans(MEDDISSEG))
    assert {type(m) for m in default.stage1_head.modules() if isinstance(m, _NormBase)} == {torch.nn.BatchNorm2d}
