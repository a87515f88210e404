"""Settings for an encoder trained from random initialisation, the from-scratch recipe variants,
and the per-group gradient norms logged by every trainer."""
import math
from copy import deepcopy

import pytest
import torch

from nnunetv2_meddisseg.ablation.study_trainers import (
    nnUNetTrainerMedDisSeg_cosineCentred,
    nnUNetTrainerMedDisSeg_plainSGD,
    nnUNetTrainerMedDisSeg_scratchSGD,
    nnUNetTrainerMedDisSeg_scratchSGDCentred,
)
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.stages import STAGE_2
from nnunetv2_meddisseg.training.variants import (
    PLAIN_TRAINING,
    SCRATCH_SGD,
    SCRATCH_SGD_CENTRED,
    nnUNetTrainerDispersive_cosine,
    nnUNetTrainerDispersive_infonceL2,
)
from tests.training.test_trainer_meddisseg import (
    MEDDISSEG,
    PLAIN_UNET,
    make_batch,
    make_trainer,
    run_epoch,
    tiny_plans,
)


def test_scratch_settings_apply_with_and_without_encoder_weights(nnunet_dirs):
    """A variant's recipe is its class's: the plans' encoder weights change no setting."""
    architecture = deepcopy(MEDDISSEG)
    architecture["arch_kwargs"]["encoder_weights"] = "resnet50_imagenet.pth"  # read only at initialize
    for plans in (None, tiny_plans(architecture)):
        trainer = make_trainer(nnUNetTrainerMedDisSeg_scratchSGD, plans=plans, initialize=False)
        assert {name: getattr(trainer.recipe, name) for name in SCRATCH_SGD} == dict(SCRATCH_SGD)
    kept = make_trainer(nnUNetTrainerMedDisSeg, initialize=False)
    assert (kept.recipe.optimizer, kept.recipe.stage2_encoder_lr) == ("adam", 1e-5)


def test_centred_recipe_differs_from_sgd_only_in_the_dispersive_form(nnunet_dirs):
    assert {k: v for k, v in SCRATCH_SGD_CENTRED.items() if SCRATCH_SGD[k] != v} == {
        "dispersive_variant": "infonce_cosine_centred"}
    trainer = make_trainer(nnUNetTrainerMedDisSeg_scratchSGDCentred, num_epochs=2)
    assert trainer.recipe.dispersive_variant == "infonce_cosine_centred"
    result = trainer.train_step(make_batch())
    assert math.isfinite(float(result["loss"]))


def test_sgd_recipe_builds_nesterov_sgd_for_both_groups(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_scratchSGD, num_epochs=2)
    trainer._enter_stage(STAGE_2)
    optimizer = trainer.optimizer
    assert isinstance(optimizer, torch.optim.SGD)
    assert {g["name"]: g["lr"] for g in optimizer.param_groups} == {"decoder": 1e-2, "encoder": 1e-2}
    assert all(g["nesterov"] and g["momentum"] == 0.99 for g in optimizer.param_groups)


def test_plain_variant_trains_the_final_logits_only(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_plainSGD, num_epochs=2)
    assert trainer.stage1_epochs == 0
    trainer.on_train_epoch_start()
    assert trainer.training_stage == STAGE_2
    result = trainer.train_step(make_batch())
    assert math.isclose(float(result["loss"]), result["loss_seg"], rel_tol=1e-5)
    assert result["loss_fg_bg"] > 0  # still computed and logged, weighted 0


def _one_train_step(cls, plans_arch) -> tuple:
    """A fresh ``cls`` trainer on tiny plans and the result of one training step (nnU-Net's own network
    gets its deep-supervision targets: full and 1/2 resolution)."""
    trainer = make_trainer(cls, plans=tiny_plans(plans_arch), num_epochs=2)
    trainer.on_train_epoch_start()
    batch = make_batch()
    if issubclass(cls, nnUNetTrainerDispersive):
        batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    return trainer, trainer.train_step(batch)


@pytest.mark.parametrize("cls, plans_arch, groups", [
    (nnUNetTrainerMedDisSeg_scratchSGD, PLAIN_UNET, ("decoder", "encoder")),
    (nnUNetTrainerDispersive_infonceL2, PLAIN_UNET, ("network",)),
])
@pytest.mark.e2e  # the whole network trained through a trainer (the quick loop leaves it out)
def test_gradient_norms_are_the_groups_norms_before_clipping(nnunet_dirs, cls, plans_arch, groups):
    trainer, result = _one_train_step(cls, plans_arch)
    reported = {name: result[f"grad_norm_{name}"] for name in groups}
    total = math.sqrt(sum(v * v for v in reported.values()))
    clip = min(1.0, 12 / (total + 1e-6))  # clip_grad_norm_'s factor
    for i, group in enumerate(trainer.optimizer.param_groups):
        name = group.get("name", "network")
        after = math.sqrt(sum(float(p.grad.float().norm()) ** 2 for p in group["params"] if p.grad is not None))
        assert reported[name] > 0
        # the reported norms are fp32 reductions over up to millions of gradients (torch._foreach_norm): measured
        # up to 3e-4 from a float64 reference where an untrained encoder's gradient norm is in the thousands
        assert after == pytest.approx(reported[name] * clip, rel=1e-3)


def test_plain_training_constants_match_the_plain_variants():
    for name, value in PLAIN_TRAINING.items():
        assert getattr(nnUNetTrainerMedDisSeg_plainSGD.recipe, name) == value


def test_dispersive_trainer_default_form_cannot_be_lowered_by_scale():
    from nnunetv2_meddisseg.losses import dispersive_loss

    h = torch.randn(4, 8, 5, 5, generator=torch.Generator().manual_seed(0))
    default = nnUNetTrainerDispersive.recipe.dispersive_variant
    assert dispersive_loss(10 * h, default).item() == pytest.approx(dispersive_loss(h, default).item(), abs=1e-5)
    paper = nnUNetTrainerDispersive_infonceL2.recipe.dispersive_variant
    assert dispersive_loss(10 * h, paper).item() < dispersive_loss(h, paper).item() - 1.0


@pytest.mark.parametrize("cls, plans_arch, uncentred", [
    (nnUNetTrainerMedDisSeg_cosineCentred, MEDDISSEG, nnUNetTrainerMedDisSeg),
    (nnUNetTrainerDispersive, PLAIN_UNET, nnUNetTrainerDispersive_cosine),
])
@pytest.mark.e2e  # the whole network trained through a trainer (the quick loop leaves it out)
def test_centred_form_trainers_train_with_the_centred_loss(nnunet_dirs, cls, plans_arch, uncentred):
    from nnunetv2_meddisseg.losses import dispersive_loss

    assert cls.recipe.dispersive_variant == "infonce_cosine_centred" != uncentred.recipe.dispersive_variant
    _, result = _one_train_step(cls, plans_arch)
    assert math.isfinite(float(result["loss"])) and math.isfinite(result["loss_dispersive"])
    # adding a common offset to every sample leaves the centred loss unchanged, unlike the uncentred one
    h = torch.rand(4, 6, 3, 3, generator=torch.Generator().manual_seed(1))
    assert dispersive_loss(h + 5, cls.recipe.dispersive_variant).item() == pytest.approx(
        dispersive_loss(h, cls.recipe.dispersive_variant).item(), abs=1e-4)
    assert abs(dispersive_loss(h + 5, "infonce_cosine").item() - dispersive_loss(h, "infonce_cosine").item()) > 0.01


@pytest.mark.e2e  # the whole network trained through a trainer (the quick loop leaves it out)
def test_an_epoch_without_any_gradient_is_reported(nnunet_dirs):
    from pathlib import Path

    trainer = make_trainer(num_epochs=2)
    batch = make_batch()
    run_epoch(trainer, batch)
    assert "stopped learning" not in Path(trainer.log_file).read_text()
    # every gradient zero, as when a GradScaler's scale has shrunk until all gradients underflow
    handles = [p.register_hook(torch.zeros_like) for p in trainer.network.parameters()]
    run_epoch(trainer, batch)
    for h in handles:
        h.remove()
    log = Path(trainer.log_file).read_text()
    assert "WARNING: no training step of epoch 1 changed the weights" in log
    assert log.count("stopped learning") == 1
