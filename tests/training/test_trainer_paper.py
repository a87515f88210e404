"""nnUNetTrainerMedDisSeg_paper: the paper's schedule (cosine per group, 300 epochs of one pass over
the training set, early stopping with patience 100, flips and rotations only)."""
import json
import math

import numpy as np
import pytest
import torch
from batchgeneratorsv2.transforms.spatial.mirroring import MirrorTransform
from batchgeneratorsv2.transforms.spatial.spatial import SpatialTransform

from nnunetv2_meddisseg.training.curves import TrainingCurves
from nnunetv2_meddisseg.training.lr_schedule import cosine_lr
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import (EarlyStopping, iterations_per_epoch,
                                                                       nnUNetTrainerMedDisSeg_paper)
from test_trainer_meddisseg import DATASET, make_trainer, nnunet_dirs  # noqa: F401 (fixture)


def test_paper_epochs_and_stage_split(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    assert (trainer.num_epochs, trainer.stage1_epochs) == (300, 75)
    assert trainer.early_stopping.patience == 100


def test_cosine_schedule_per_group(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    trainer.initialize()
    for stage, start, length, bases in ((STAGE_1, 0, 75, (1e-4, 1e-4)), (STAGE_2, 75, 225, (1e-4, 1e-5))):
        optimizer, scheduler = trainer.configure_optimizers(stage)
        assert isinstance(optimizer, torch.optim.Adam)
        assert [g["name"] for g in optimizer.param_groups] == ["decoder", "encoder"]
        for k in (0, 1, length // 2, length - 1, length):
            scheduler.step(start + k)
            expected = [b * (1 + math.cos(math.pi * k / length)) / 2 for b in bases]  # independent formula
            assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(expected, rel=1e-12, abs=1e-15)
        scheduler.step(start + length // 2)
        assert scheduler.get_last_lr() == pytest.approx([b / 2 for b in bases], rel=0.05)  # about half-way
    assert cosine_lr(1.0, 0, 10) == 1.0 and cosine_lr(1.0, 10, 10) == pytest.approx(0.0, abs=1e-15)


def test_iterations_per_epoch_from_the_training_set(nnunet_dirs, tmp_path):
    assert iterations_per_epoch(880, 4) == 220 and iterations_per_epoch(881, 4) == 221
    assert iterations_per_epoch(3, 4) == 1
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    folder = tmp_path / "preprocessed" / DATASET
    splits = [{"train": [f"case_{i:03d}" for i in range(9)], "val": [f"case_{i:03d}" for i in range(9, 12)]}]
    (folder / "splits_final.json").write_text(json.dumps(splits))
    for i in range(12):
        (folder / "nnUNetPlans_2d" / f"case_{i:03d}.b2nd").touch()
    trainer.batch_size = 4
    tr_keys, val_keys = trainer.do_split()
    assert (len(tr_keys), len(val_keys)) == (9, 3)
    assert (trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch) == (3, 1)


def test_early_stopping_counts_epochs_since_the_best():
    stopper = EarlyStopping(patience=3)
    scores = [0.1, 0.2, 0.5, 0.5, 0.4, 0.6, 0.6, 0.6, 0.6]
    fired = [stopper.update(e, s) for e, s in enumerate(scores)]
    # 0.5 at epoch 2 is beaten at epoch 5, one epoch before patience ran out; best 0.6 at epoch 5
    # (equal scores are no improvement): fires 3 epochs later, at epoch 8
    assert fired == [False] * 8 + [True]
    assert (stopper.best, stopper.best_epoch) == (0.6, 5)
    restored = EarlyStopping(1)
    restored.load_state_dict(stopper.state_dict())
    assert restored.state_dict() == stopper.state_dict()


def test_early_stopping_fires_on_an_ema_plateau_in_stage2(nnunet_dirs, monkeypatch):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    trainer.initialize()
    trainer.stage1_epochs = 2
    trainer.early_stopping = EarlyStopping(patience=4)
    trainer.disable_checkpointing = True
    monkeypatch.setattr(trainer.logger, "plot_progress_png", lambda *a, **k: None)
    monkeypatch.setattr(TrainingCurves, "plot", lambda *a, **k: None)
    # high in Stage I (must not count), a peak early in Stage II, then a plateau below it
    dice = [0.9, 0.9, 0.1, 0.5, 0.9, 0.9] + [0.2] * 10
    stopped_at = None
    for epoch, d in enumerate(dice):
        trainer.current_epoch = epoch
        trainer.training_stage = STAGE_1 if epoch < 2 else STAGE_2
        for key, value in (("epoch_start_timestamps", 0.0), ("train_losses", 1.0), ("val_losses", 1.0),
                           ("dice_per_class_or_region", [d, d]), ("lrs", 1e-4)):
            trainer.logger.log(key, value, epoch)
        trainer.logger.log("mean_fg_dice", d, epoch)
        if epoch == 2:
            trainer._restart_ema_fg_dice()
        trainer.on_epoch_end()
        if getattr(trainer, "stop_training", False):
            stopped_at = epoch
            break
    assert stopped_at is not None
    ema = [trainer.logger.get_value("ema_fg_dice", step=e) for e in range(2, stopped_at + 1)]
    best_epoch = 2 + int(np.argmax(ema))
    assert best_epoch > 2 and stopped_at == best_epoch + 4 < len(dice) - 1
    assert trainer.early_stopping.best_epoch == best_epoch


def test_flips_and_rotations_only():
    transforms = nnUNetTrainerMedDisSeg_paper.get_training_transforms(
        (32, 32), (-math.pi, math.pi), None, (0, 1), False).transforms
    assert [type(t).__name__ for t in transforms] == ["SpatialTransform", "MirrorTransform", "RemoveLabelTransform"]
    spatial = transforms[0]
    assert isinstance(spatial, SpatialTransform) and isinstance(transforms[1], MirrorTransform)
    assert spatial.p_rotation == nnUNetTrainerMedDisSeg_paper.rotation_probability
    assert spatial.p_scaling == 0 and spatial.p_elastic_deform == 0


def test_nnunet_finds_the_paper_trainer(monkeypatch):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    from nnunetv2_meddisseg.trainer_path import trainer_folder

    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    assert recursive_find_trainer_class_by_name("nnUNetTrainerMedDisSeg_paper") is nnUNetTrainerMedDisSeg_paper
