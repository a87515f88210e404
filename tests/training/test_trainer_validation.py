"""Validation steps and loss: nnUNetTrainerMedDisSeg validates the current stage's logits (Stage I: network +
head; Stage II: the network's final logits) as nnU-Net's ``validation_step`` does; its loss and pseudo Dice counts
equal an independent computation from those logits, with and without an ignore label. Its loss is nnU-Net's
``_build_loss`` without the deep-supervision wrapper."""
import math
from copy import deepcopy

import numpy as np
import pytest
import torch
from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
from test_trainer_meddisseg import DATASET_JSON, make_batch, make_trainer

from nnunetv2_meddisseg.training.objectives import segmentation_loss
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.variants import nnUNetTrainerDispersive_smoke

IGNORE_JSON = {**deepcopy(DATASET_JSON), "labels": {"background": 0, "a": 1, "b": 2, "ignore": 3}}


def _reference(trainer, batch, ignore_label=None):
    """loss, tp, fp, fn (foreground classes) of the stage's arg-max prediction, counted with NumPy."""
    target = batch["target"].clone()
    with torch.no_grad():
        logits = trainer.stage.validation_logits(trainer.network, batch["data"])
        loss = float(trainer.loss(logits, target))
    predicted, truth = logits.argmax(1).numpy(), target[:, 0].numpy()
    counted = truth != ignore_label if ignore_label is not None else np.ones_like(truth, dtype=bool)
    counts = []
    for kind in ("tp", "fp", "fn"):
        row = []
        for c in (1, 2):
            hit = {"tp": (predicted == c) & (truth == c), "fp": (predicted == c) & (truth != c),
                   "fn": (predicted != c) & (truth == c)}[kind]
            row.append(int((hit & counted).sum()))
        counts.append(np.array(row))
    return (loss, *counts)


def _enter(trainer, stage):
    trainer.current_epoch = 0 if stage == STAGE_1 else trainer.stage1_epochs
    trainer.on_train_epoch_start()
    assert trainer.training_stage == stage
    trainer.on_validation_epoch_start()


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("stage", [STAGE_1, STAGE_2])
def test_validation_step_is_nnunets_on_the_stage_logits(nnunet_dirs, stage, ignore):
    torch.manual_seed(0)
    trainer = make_trainer(dataset_json=IGNORE_JSON if ignore else DATASET_JSON)
    assert trainer.label_manager.has_ignore_label == ignore
    batch = make_batch()
    if ignore:
        batch["target"][:, :, 10:20, :] = 3  # a band of unlabelled pixels across both classes
    _enter(trainer, stage)
    network = trainer.network
    trainer.network.eval()
    if trainer.stage1_head is not None:
        trainer.stage1_head.eval()
    loss, tp, fp, fn = _reference(trainer, batch, 3 if ignore else None)
    with torch.no_grad():
        result = trainer.validation_step(batch)
    assert float(result["loss"]) == pytest.approx(loss, rel=1e-5)
    assert (result["tp_hard"].tolist(), result["fp_hard"].tolist(), result["fn_hard"].tolist()) == \
        (tp.tolist(), fp.tolist(), fn.tolist())
    assert tp.sum() + fp.sum() + fn.sum() > 0
    assert trainer.network is network and trainer.enable_deep_supervision is False


def test_stage2_validation_scores_the_final_logits_not_a_path(nnunet_dirs):
    """Stage II validates the network's logits (``output="logits"``): the pseudo Dice is perfect where they are
    the target's one-hot, whatever the network's other outputs say."""
    trainer = make_trainer()
    _enter(trainer, STAGE_2)
    batch = make_batch()
    plain = trainer._plain_network()
    perfect = torch.nn.functional.one_hot(batch["target"][:, 0].long(), 3).permute(0, 3, 1, 2).float() * 20

    def forward(x, output="logits"):
        every = type(plain).forward(plain, x, output="all")
        wrong = every._replace(logits=torch.flip(every.logits, dims=(1,)))
        return perfect.clone() if output == "logits" else wrong

    plain.forward = forward
    with torch.no_grad():
        result = trainer.validation_step(batch)
    assert result["fp_hard"].tolist() == result["fn_hard"].tolist() == [0, 0]
    assert result["tp_hard"].tolist() == [2 * 100, 2 * 140]


def test_dispersive_trainer_checks_validation_batches(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerDispersive_smoke)  # nnU-Net's PlainConvUNet, deep supervision on
    batch = make_batch()
    batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
    trainer.on_train_epoch_start()
    trainer.on_validation_epoch_start()
    with torch.no_grad():
        assert math.isfinite(float(trainer.validation_step(batch)["loss"]))
    batch["data"][0, 1, 2, 2] = float("inf")
    with pytest.raises(RuntimeError, match=r"NaN or inf.*validation batch of epoch 0: case_000\."):
        trainer.validation_step(batch)


@pytest.mark.parametrize("ignore", [False, True])
def test_the_loss_is_nnunets_without_the_deep_supervision_wrapper(nnunet_dirs, ignore):
    trainer = make_trainer(dataset_json=IGNORE_JSON if ignore else DATASET_JSON)
    assert type(trainer.loss) is DC_and_CE_loss and not trainer.enable_deep_supervision
    reference = segmentation_loss(trainer.configuration_manager.batch_dice, 3 if ignore else None)
    logits = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    target = make_batch()["target"]
    if ignore:
        target[:, :, :5] = 3
    assert float(trainer.loss(logits, target.clone())) == pytest.approx(float(reference(logits, target.clone())),
                                                                        rel=1e-6)
