"""Per-epoch curves, their plot, atomic checkpoint writes and the NaN input check."""
import math
import os

import pytest
import torch

from nnunetv2_meddisseg.training.base import atomic_torch_save, check_finite_input
from nnunetv2_meddisseg.training.curves import TrainingCurves


def test_curves_pad_skipped_epochs_and_round_trip():
    curves = TrainingCurves()
    curves.log("loss_seg", 1.0, 0)
    curves.log("loss_fg_bg", 2.0, 2)  # a Stage II term, first logged at epoch 2
    curves.log("loss_seg", 0.5, 1)
    curves.log("loss_seg", 0.25, 1)  # overwrite
    assert curves.get("loss_seg") == [1.0, 0.25]
    fg = curves.get("loss_fg_bg")
    assert math.isnan(fg[0]) and math.isnan(fg[1]) and fg[2] == 2.0
    assert math.isnan(curves.get("loss_seg", 5))
    restored = TrainingCurves()
    restored.load_checkpoint(curves.get_checkpoint())
    assert restored.get("loss_seg") == [1.0, 0.25]
    assert restored.keys("loss_") == ["loss_fg_bg", "loss_seg"]


def test_plot_writes_a_png(tmp_path):
    curves = TrainingCurves()
    for epoch in range(4):
        curves.log_many({"loss_seg": 1.0 / (epoch + 1), "lr_encoder": 1e-5, "lr_decoder": 1e-4,
                         "dispersion_mean_pairwise_distance": 0.5 + epoch,
                         "dispersion_effective_rank": 1.5}, epoch)
    target = tmp_path / "progress_terms.png"
    curves.plot(str(target), stage_boundaries=(2,))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["progress_terms.png"]


def test_atomic_save_replaces_and_cleans_up(tmp_path):
    target = tmp_path / "checkpoint_latest.pth"
    stale = tmp_path / "checkpoint_latest.pth.12345.tmp"
    stale.write_bytes(b"partial")
    atomic_torch_save({"a": torch.arange(3)}, str(target))
    assert torch.load(target)["a"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_latest.pth"]


def test_atomic_save_failure_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint_latest.pth"
    atomic_torch_save({"epoch": 1}, str(target))

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of a save

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"epoch": 2}, str(target))
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
