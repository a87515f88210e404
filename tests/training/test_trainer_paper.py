"""nnUNetTrainerMedDisSeg_paper: the paper's schedule (cosine per group, 300 epochs of one pass over
the training set, early stopping with patience 100, flips and rotations only)."""
import itertools
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from batchgeneratorsv2.transforms.spatial.mirroring import MirrorTransform
from batchgeneratorsv2.transforms.spatial.spatial import SpatialTransform
from test_trainer_meddisseg import DATASET, make_trainer, tiny_plans

from nnunetv2_meddisseg.training import trainer_base
from nnunetv2_meddisseg.training.lr_schedule import cosine_lr
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import (
    EarlyStopping,
    _EarlyStop,
    iterations_per_epoch,
    nnUNetTrainerMedDisSeg_paper,
)
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2


def test_paper_epochs_and_stage_split(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    assert (trainer.num_epochs, trainer.stage1_epochs) == (300, 75)
    assert trainer.early_stopping.patience == 100


def test_cosine_schedule_per_group(nnunet_dirs):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False)
    trainer.initialize()
    for stage, start, length, bases, groups in ((STAGE_1, 0, 75, (1e-4, 1e-4), ["head", "encoder"]),
                                                (STAGE_2, 75, 225, (1e-4, 1e-5), ["decoder", "encoder"])):
        trainer._enter_stage(stage)
        optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
        assert isinstance(optimizer, torch.optim.Adam)
        assert [g["name"] for g in optimizer.param_groups] == groups
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
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, stage1_epochs=2)
    trainer.early_stopping = EarlyStopping(patience=4)
    trainer.disable_checkpointing = True
    monkeypatch.setattr(trainer.logger, "plot_progress_png", lambda *a, **k: None)
    monkeypatch.setattr(trainer_base, "plot_curves", lambda *a, **k: None)
    # high in Stage I (must not count), a peak early in Stage II, then a plateau below it
    dice = [0.9, 0.9, 0.1, 0.5, 0.9, 0.9] + [0.2] * 10
    stopped_at = None
    for epoch, d in enumerate(dice):
        trainer.current_epoch = epoch
        if trainer.training_stage != trainer.stage_for_epoch(epoch):
            trainer._enter_stage(trainer.stage_for_epoch(epoch))
        for key, value in (("epoch_start_timestamps", 0.0), ("train_losses", 1.0), ("val_losses", 1.0),
                           ("dice_per_class_or_region", [d, d]), ("lrs", 1e-4)):
            trainer.logger.log(key, value, epoch)
        trainer.logger.log("mean_fg_dice", d, epoch)
        if epoch == trainer.best_checkpoint_from:
            trainer.logger.log("ema_fg_dice", d, epoch)  # the EMA starts afresh (on_validation_epoch_end)
        try:
            trainer.on_epoch_end()
        except _EarlyStop:
            stopped_at = epoch
            break
    assert stopped_at is not None and trainer.current_epoch == stopped_at + 1  # nnU-Net's epoch end ran to its end
    ema = [trainer.logger.get_value("ema_fg_dice", step=e) for e in range(2, stopped_at + 1)]
    best_epoch = 2 + int(np.argmax(ema))
    assert best_epoch > 2 and stopped_at == best_epoch + 4 < len(dice) - 1
    assert trainer.early_stopping.best_epoch == best_epoch


def _loop_trainer(monkeypatch, dice, patience=3, num_epochs=20):
    """A paper trainer whose epochs run through nnU-Net's own ``run_training`` loop with stand-in steps:
    training steps do nothing, validation reports pseudo Dice ``dice[epoch]`` for both classes (fp = fn),
    nnU-Net's dataloaders and dataset unpacking are replaced by endless ``None`` batches. Returns the
    trainer and the record of its steps and checkpoints (``checkpoint_final.pth`` is really written)."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

    def start(self):  # nnU-Net's on_train_start without dataloaders, unpacking and plots
        if not self.was_initialized:
            self.initialize()
        self.dataloader_train = self.dataloader_val = itertools.repeat(None)
        os.makedirs(self.output_folder, exist_ok=True)

    monkeypatch.setattr(nnUNetTrainer, "on_train_start", start)
    monkeypatch.setattr(trainer_base, "plot_curves", lambda *a, **k: None)
    trainer = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False, num_epochs=num_epochs, stage1_epochs=2)
    trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch = 2, 1
    trainer.early_stopping = EarlyStopping(patience)
    monkeypatch.setattr(trainer.logger, "plot_progress_png", lambda *a, **k: None)
    record = {"train_steps": [], "checkpoints": []}

    def train_step(batch):
        record["train_steps"].append(trainer.current_epoch)
        return {"loss": np.array(0.5)}

    def validation_step(batch):
        d = dice[trainer.current_epoch]
        tp, fn = np.array([100 * d] * 2), np.array([100 * (1 - d)] * 2)
        return {"loss": np.array(0.5), "tp_hard": tp, "fp_hard": fn, "fn_hard": fn}

    def save_checkpoint(filename):
        record["checkpoints"].append((os.path.basename(filename), trainer.current_epoch + 1))
        if os.path.basename(filename) == "checkpoint_final.pth":
            nnUNetTrainerMedDisSeg_paper.save_checkpoint(trainer, filename)

    trainer.train_step, trainer.validation_step, trainer.save_checkpoint = train_step, validation_step, save_checkpoint
    return trainer, record


def test_early_stopping_ends_nnunets_own_training_loop(nnunet_dirs, monkeypatch):
    # Stage I (epochs 0, 1) high, must not count; Stage II: a peak, then a plateau below it
    dice = [0.9, 0.9, 0.1, 0.5, 0.9, 0.9] + [0.2] * 14
    trainer, record = _loop_trainer(monkeypatch, dice)
    trainer.run_training()  # nnU-Net's loop (nnUNetTrainer.run_training)
    ema = trainer.logger.get_value("ema_fg_dice", step=None)
    best_epoch = 2 + int(np.argmax(ema[2:len(ema)]))
    stopped_at = best_epoch + 3
    assert stopped_at < trainer.num_epochs - 1 and len(ema) == stopped_at + 1  # no epoch after the stop
    assert record["train_steps"] == [e for e in range(stopped_at + 1) for _ in range(2)]
    # on_train_end ran once: checkpoint_final.pth of the last finished epoch, the log's last line
    assert record["checkpoints"][-1] == ("checkpoint_final.pth", stopped_at + 1)
    assert [c for c, _ in record["checkpoints"]].count("checkpoint_final.pth") == 1
    assert Path(trainer.log_file).read_text().rstrip().endswith("Training done.")
    # the schedule of Stage II still spans the planned epochs (num_epochs is left alone)
    assert (trainer.num_epochs, trainer.stage1_epochs) == (20, 2)
    assert (trainer.lr_scheduler.start_epoch, trainer.lr_scheduler.num_epochs) == (2, 18)
    expected = [b * (1 + math.cos(math.pi * (stopped_at - 2) / 18)) / 2 for b in (1e-4, 1e-5)]
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx(expected, rel=1e-12)
    final = torch.load(Path(trainer.output_folder) / "checkpoint_final.pth", weights_only=False)
    assert final["current_epoch"] == stopped_at + 1
    assert final["early_stopping"] == {"patience": 3, "best": pytest.approx(max(ema[2:])), "best_epoch": best_epoch}


def test_a_resumed_run_that_had_stopped_does_not_train(nnunet_dirs, monkeypatch):
    dice = [0.9, 0.9, 0.1, 0.5, 0.9, 0.9] + [0.2] * 14
    trainer, _ = _loop_trainer(monkeypatch, dice)
    trainer.run_training()
    final = Path(trainer.output_folder) / "checkpoint_final.pth"
    stopped_epochs = torch.load(final, weights_only=False)["current_epoch"]
    resumed, record = _loop_trainer(monkeypatch, dice)
    resumed.load_checkpoint(str(final))  # what nnUNetv2_train --c does (checkpoint_final.pth first)
    assert resumed.current_epoch == stopped_epochs < resumed.num_epochs
    resumed.run_training()
    assert record["train_steps"] == [] and record["checkpoints"] == [("checkpoint_final.pth", stopped_epochs)]
    assert "early stopping was met before epoch" in Path(resumed.log_file).read_text()
    # one epoch short of the patience: the resumed run trains on
    almost, record = _loop_trainer(monkeypatch, dice)
    almost.load_checkpoint(str(final))
    almost.early_stopping.best_epoch += 1
    almost.run_training()
    assert record["train_steps"][:2] == [stopped_epochs] * 2


def test_flips_and_rotations_only(nnunet_dirs):
    transforms = make_trainer(nnUNetTrainerMedDisSeg_paper, initialize=False).get_training_transforms(
        (32, 32), (-math.pi, math.pi), None, (0, 1), False).transforms
    assert [type(t).__name__ for t in transforms] == ["SpatialTransform", "MirrorTransform", "RemoveLabelTransform"]
    spatial = transforms[0]
    assert isinstance(spatial, SpatialTransform) and isinstance(transforms[1], MirrorTransform)
    assert spatial.p_rotation == nnUNetTrainerMedDisSeg_paper.recipe.rotation_probability == 0.5
    assert spatial.p_scaling == 0 and spatial.p_elastic_deform == 0


def test_a_recipe_sets_the_rotation_probability(nnunet_dirs):
    class Rotated(nnUNetTrainerMedDisSeg_paper):
        recipe = replace(nnUNetTrainerMedDisSeg_paper.recipe, rotation_probability=0.2)

    args = ((32, 32), (-math.pi, math.pi), None, (0, 1), False)
    trainer = make_trainer(Rotated, initialize=False)  # nnU-Net calls it through the trainer
    assert trainer.get_training_transforms(*args).transforms[0].p_rotation == 0.2
    plans = tiny_plans()
    plans["meddisseg_recipe"] = {"rotation_probability": 0.7, "early_stopping_patience": 3}
    overridden = make_trainer(nnUNetTrainerMedDisSeg_paper, plans=plans, initialize=False)
    assert overridden.get_training_transforms(*args).transforms[0].p_rotation == 0.7
    assert overridden.early_stopping.patience == 3


def test_nnunet_finds_the_paper_trainer(monkeypatch):
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    from nnunetv2_meddisseg.environment import trainer_folder

    monkeypatch.setenv("nnUNet_extTrainer", trainer_folder())
    assert recursive_find_trainer_class_by_name("nnUNetTrainerMedDisSeg_paper") is nnUNetTrainerMedDisSeg_paper
