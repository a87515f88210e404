"""Per-epoch curves through nnU-Net's logger, their plot, atomic checkpoint writes and the NaN input check."""
import math
import os
from pathlib import Path

import pytest
import torch

from nnunetv2_meddisseg.training.checkpoints import save_checkpoint_file
from nnunetv2_meddisseg.training.curves import CurvesLogger, plot_curves
from nnunetv2_meddisseg.training.finite_input import check_finite_input


def test_curves_pad_skipped_epochs_and_are_replaced_by_a_second_value():
    logger = CurvesLogger()
    logger.log("loss_seg", 1.0, 0)
    logger.log("loss_fg_bg", 2.0, 2)  # a Stage II term, first logged at epoch 2
    logger.log("loss_seg", 0.5, 1)
    logger.log("loss_seg", 0.25, 1)  # replaced
    assert logger.get_value("loss_seg", step=None) == [1.0, 0.25]
    fg = logger.get_value("loss_fg_bg", step=None)
    assert math.isnan(fg[0]) and math.isnan(fg[1]) and fg[2] == 2.0
    logger.fill_missing(3)
    assert len(logger.get_value("loss_seg", step=None)) == 4 and math.isnan(logger.get_value("loss_seg", step=3))
    assert logger.get_value("train_losses", step=None) == []  # nnU-Net's own keys are left alone


def test_plot_writes_a_png(tmp_path):
    curves = {"loss_seg": [1.0 / (epoch + 1) for epoch in range(4)], "lr_encoder": [1e-5] * 4, "lr_head": [1e-4] * 4,
              "dispersion_mean_pairwise_distance": [0.5 + epoch for epoch in range(4)],
              "dispersion_effective_rank": [1.5] * 4, "train_losses": [0.5] * 4}
    target = tmp_path / "progress_terms.png"
    plot_curves(curves, str(target), stage_boundaries=(2,))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["progress_terms.png"]


def test_checkpoint_save_writes_through_no_file_of_a_temporary_name(tmp_path):
    target = tmp_path / "checkpoint_latest.pth"
    (tmp_path / "elsewhere").write_bytes(b"mine")
    (tmp_path / ".checkpoint_latest.pth.partial").symlink_to(tmp_path / "elsewhere")
    save_checkpoint_file({"a": torch.arange(3)}, str(target))
    assert torch.load(target)["a"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoint_latest.pth.partial", "checkpoint_latest.pth",
                                                          "elsewhere"]
    assert (tmp_path / "elsewhere").read_bytes() == b"mine"


def test_checkpoint_save_failure_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint_latest.pth"
    save_checkpoint_file({"epoch": 1}, str(target))

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a save

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint_file({"epoch": 2}, str(target))
    monkeypatch.undo()
    assert torch.load(target)["epoch"] == 1
    assert os.listdir(tmp_path) == ["checkpoint_latest.pth"]


def test_check_finite_input_names_the_cases():
    data = torch.zeros(3, 2, 4, 4)
    check_finite_input(data, ["a", "b", "c"])  # no error
    data[1, 0, 2, 2] = float("nan")
    data[2, 1, 0, 0] = float("inf")
    with pytest.raises(RuntimeError, match=r"NaN or inf.*: b, c\."):
        check_finite_input(data, ["a", "b", "c"])
    with pytest.raises(RuntimeError, match="batch positions 1, 2"):
        check_finite_input(data, None)


# ---------------------------------------------------------------------------------------- nnU-Net's logger
class _StandInRun:
    """What nnU-Net's WandbLogger uses of a W&B run: ``config.update``, ``step``, ``log``, ``summary``."""

    def __init__(self, **settings):
        self.settings = settings
        self.config = {}
        self.config_updates = []
        self.step = 0
        self.logged = []  # (step, {key: value})
        self.summary = {}

    def log(self, values, step):
        self.logged.append((step, dict(values)))


class _StandInConfig(dict):
    def update(self, values=(), **kwargs):
        super().update(values, **kwargs)


class _StandInWandb:
    def __init__(self):
        self.runs = []

    def init(self, **settings):
        run = _StandInRun(**settings)
        run.config = _StandInConfig()
        self.runs.append(run)
        return run


def _logged_per_key(run):
    per_key = {}
    for step, values in run.logged:
        for key, value in values.items():
            per_key.setdefault(key, {})[step] = value
    return per_key


def _same(a, b):
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y) for x, y in zip(a, b))


@pytest.fixture
def stand_in_wandb(monkeypatch):
    from nnunetv2.training.logging import nnunet_logger
    wandb = _StandInWandb()
    monkeypatch.setattr(nnunet_logger, "wandb", wandb)
    monkeypatch.setenv("nnUNet_wandb_enabled", "1")
    monkeypatch.setenv("nnUNet_wandb_mode", "offline")
    return wandb


def test_our_curves_reach_wandb_through_nnunets_logger_and_survive_resume(nnunet_dirs, stand_in_wandb):
    from test_trainer_meddisseg import make_batch, make_trainer, run_epoch

    torch.manual_seed(0)
    trainer = make_trainer()  # the smoke schedule: epoch 0 Stage I, epoch 1 Stage II
    assert len(stand_in_wandb.runs) == 1
    run = stand_in_wandb.runs[0]
    batch = make_batch()
    outputs = [run_epoch(trainer, batch) for _ in range(2)]
    logged = _logged_per_key(run)
    # nnU-Net's own values and ours arrive alike, each at its epoch
    assert sorted(logged["train_losses"]) == [0, 1]
    assert sorted(logged["loss_dispersive"]) == [0, 1]
    for epoch in range(2):
        assert logged["loss_dispersive"][epoch] == pytest.approx(outputs[epoch]["loss_dispersive"])
        assert logged["dispersion_effective_rank"][epoch] == pytest.approx(outputs[epoch]["dispersion_effective_rank"])
    assert [logged["stage"][e] for e in (0, 1)] == [1.0, 2.0]
    grad_norms = sorted(k for k in logged if k.startswith("grad_norm_"))
    assert grad_norms == ["grad_norm_decoder", "grad_norm_encoder", "grad_norm_head"]  # Stage II's, both's, Stage I's
    assert [sorted(logged[k]) for k in grad_norms] == [[1], [0, 1], [0]]
    assert sorted(logged["loss_fg_bg"]) == [1]  # a Stage II term: not sent for Stage I
    # locally every list holds one value per epoch (NaN where the term did not exist), as nnU-Net's plot needs
    lists = trainer.logger.get_checkpoint()
    assert {len(v) for v in lists.values()} == {2}
    assert math.isnan(trainer.logger.get_value("loss_fg_bg", step=0))
    assert trainer.logger.get_value("loss_fg_bg", step=1) == pytest.approx(logged["loss_fg_bg"][1])
    assert (Path(trainer.output_folder) / "progress_terms.png").is_file()

    # the curves ride in nnU-Net's logging entry of the checkpoint, and a resumed trainer has them
    filename = str(nnunet_dirs / "resume.pth")
    trainer.save_checkpoint(filename)
    checkpoint = torch.load(filename, weights_only=False)
    assert _same(checkpoint["logging"]["loss_fg_bg"], trainer.logger.get_value("loss_fg_bg", step=None))
    resumed = make_trainer()
    resumed.load_checkpoint(filename)
    for key in ("loss_dispersive", "loss_fg_bg", "stage", "grad_norm_encoder", "dispersion_effective_rank",
                "lr_encoder", "train_losses", "ema_fg_dice"):
        assert _same(resumed.logger.get_value(key, step=None), trainer.logger.get_value(key, step=None)), key
    resumed.logger.log("loss_dispersive", -1.5, 2)  # logging goes on at the next epoch
    assert resumed.logger.get_value("loss_dispersive", step=2) == -1.5
    # a checkpoint given as a dict (nnU-Net 2.8.1's load_checkpoint reads file names only)
    from_dict = make_trainer()
    from_dict.load_checkpoint(torch.load(filename, weights_only=False))
    assert from_dict.current_epoch == resumed.current_epoch == 3 and from_dict.run_seed == trainer.run_seed
    assert _same(from_dict.logger.get_value("grad_norm_encoder", step=None),
                 trainer.logger.get_value("grad_norm_encoder", step=None))
    assert all(torch.equal(a, b) for a, b in zip(from_dict.network.state_dict().values(),
                                                 trainer.network.state_dict().values()))


def test_curves_logger_backfills_and_fills_missing_epochs():
    logger = CurvesLogger()
    logger.log("loss_fg_bg", 2.0, 2)  # first logged at epoch 2
    assert _same(logger.get_value("loss_fg_bg", step=None), [math.nan, math.nan, 2.0])
    logger.log("loss_fg_bg", 3.0, 2)  # logged again for its epoch: replaces
    logger.fill_missing(4)
    assert _same(logger.get_value("loss_fg_bg", step=None), [math.nan, math.nan, 3.0, math.nan, math.nan])
    assert logger.get_value("train_losses", step=None) == []  # nnU-Net's lists are nnU-Net's business
    logger.log("train_losses", 1.0, 0)
    logger.log("train_losses", 0.5, 1)
    with pytest.raises(AssertionError):
        logger.log("train_losses", 1.0, 0)  # nnU-Net's check on its own keys is kept
