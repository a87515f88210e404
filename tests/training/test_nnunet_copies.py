"""The nnU-Net code copied into ``nnunet_copies`` is pinned to the installed nnU-Net's source, and the copy
writes what nnU-Net's own method writes."""
import importlib
import math

import numpy as np
import pytest
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from test_trainer_meddisseg import make_batch, make_trainer, run_epoch

from nnunetv2_meddisseg.training.nnunet_copies import PINNED, checkpoint_entries, source_hash


def _method(name):
    module, qualified = name.split(":")
    obj = importlib.import_module(module)
    for part in qualified.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(PINNED))
def test_copied_nnunet_methods_are_unchanged(name):
    found = source_hash(_method(name))
    assert found == PINNED[name], (
        f"the installed nnU-Net's {name} differs from the source nnunetv2_meddisseg/training/nnunet_copies.py "
        f"copied (sha256 {found}, pinned {PINNED[name]}): compare the copy with it, update it and the pin")


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def test_checkpoint_entries_are_what_nnunet_writes(nnunet_dirs):
    torch.manual_seed(0)
    trainer = make_trainer()
    run_epoch(trainer, make_batch())
    nnunet_file = str(nnunet_dirs / "nnunet.pth")
    nnUNetTrainer.save_checkpoint(trainer, nnunet_file)  # nnU-Net's own method on our trainer
    written = torch.load(nnunet_file, weights_only=False)
    assert _equal(checkpoint_entries(trainer), written)
    ours_file = str(nnunet_dirs / "ours.pth")
    trainer.save_checkpoint(ours_file)
    ours = torch.load(ours_file, weights_only=False)
    assert _equal({k: ours[k] for k in written}, written)
    assert ours["run_seed"] == trainer.run_seed and "meddisseg_stage" in ours


@pytest.mark.parametrize("labels", [{"background": 0, "a": 1, "b": 2},
                                    {"background": 0, "a": 1, "b": 2, "ignore": 3}], ids=["plain", "ignore_label"])
def test_validation_counts_are_what_nnunets_validation_step_returns(labels):
    """nnU-Net's own ``validation_step`` on a stand-in trainer whose network returns fixed logits, and the copy on
    the same logits, target and loss: equal counts and loss."""
    from types import SimpleNamespace

    from nnunetv2.utilities.label_handling.label_handling import LabelManager

    from nnunetv2_meddisseg.training.nnunet_copies import validation_counts
    from nnunetv2_meddisseg.training.objectives import segmentation_loss

    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 16, 16, generator=generator)
    target = torch.randint(0, len(labels), (2, 1, 16, 16), generator=generator).float()
    manager = LabelManager(labels, regions_class_order=None)
    loss = segmentation_loss(True, manager.ignore_label)
    stand_in = SimpleNamespace(device=torch.device("cpu"), network=lambda data: logits, loss=loss,
                               enable_deep_supervision=False, label_manager=manager)
    expected = nnUNetTrainer.validation_step(stand_in, {"data": torch.zeros(2, 3, 16, 16), "target": target.clone()})
    found = validation_counts(manager, logits, target.clone(), loss(logits, target.clone()))
    assert expected.keys() == found.keys()
    for key in expected:
        assert np.array_equal(expected[key], found[key]), key
    assert found["tp_hard"].sum() > 0 and found["fp_hard"].sum() > 0


@pytest.mark.parametrize("scaled", [False, True])
def test_backward_clip_step_updates_as_nnunets_train_step(scaled):
    """nnU-Net's own ``train_step`` on a stand-in trainer and the copy on a twin network give the same weights,
    with and without a GradScaler, and with gradients large enough for the clipping at 12 to act."""
    import copy
    from types import SimpleNamespace

    import torch.nn.functional as F
    from torch import nn

    from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step

    torch.manual_seed(0)
    network = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    twin = copy.deepcopy(network)
    data, target = 10 * torch.randn(2, 1, 8, 8), torch.randint(0, 2, (2, 8, 8))

    def loss(output, t):
        return 100 * F.cross_entropy(output, t)

    def scaler():
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 4) if scaled else None

    stand_in = SimpleNamespace(device=torch.device("cpu"), network=network, loss=loss, grad_scaler=scaler(),
                               optimizer=torch.optim.SGD(network.parameters(), lr=0.1))
    nnUNetTrainer.train_step(stand_in, {"data": data, "target": target})

    optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    optimizer.zero_grad(set_to_none=True)
    value = loss(twin(data), target)  # no autocast on the CPU, as nnU-Net's
    norm = backward_clip_step(value, optimizer, scaler(), twin.parameters(), before_clipping=lambda: float(
        torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in twin.parameters()]))))
    assert norm > 12  # the clipping acted
    for a, b in zip(network.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("augmentation", [True, False])
def test_training_dataloader_is_nnunets_training_loader(preprocessed_synthetic, monkeypatch, tmp_path, augmentation):
    """The copy draws what nnU-Net's own training loader (``get_dataloaders``) draws from the same random state;
    without augmentation the samples not centred on foreground are whole preprocessed training cases (the patch
    is the image here)."""
    import json
    from pathlib import Path

    import numpy as np

    from nnunetv2_meddisseg.training.nnunet_copies import training_dataloader
    from nnunetv2_meddisseg.training.seeding import seed_generators

    for name, value in preprocessed_synthetic.items():
        if name.startswith("nnUNet_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "results"))  # the trainer's log: not the shared folder
    monkeypatch.setenv("nnUNet_n_proc_DA", "0")
    folder = Path(preprocessed_synthetic["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps"
    plans = dict(json.loads((folder / "nnUNetPlans.json").read_text()), continue_training=False)
    trainer = nnUNetTrainer(plans, "2d", 0, json.loads((folder / "dataset.json").read_text()), torch.device("cpu"))
    trainer._set_batch_size_and_oversample()  # as nnU-Net's initialize() does
    ours = training_dataloader(trainer, augmentation=augmentation)
    if augmentation:
        nnunet_loader = trainer.get_dataloaders()[0].data_loader
        seed_generators([3])
        expected = nnunet_loader.generate_train_batch()
        seed_generators([3])
        got = ours.generate_train_batch()
        assert list(got["keys"]) == list(expected["keys"])
        torch.testing.assert_close(got["data"], expected["data"], rtol=0, atol=0)
        torch.testing.assert_close(got["target"], expected["target"], rtol=0, atol=0)
    else:
        assert list(trainer.configuration_manager.patch_size) == [64, 64]
        batch = ours.generate_train_batch()
        dataset, _ = trainer.get_tr_and_val_datasets()
        random_samples = round(trainer.batch_size * (1 - trainer.oversample_foreground_percent))
        assert random_samples >= 1  # the rest are centred on foreground (shifted and padded)
        for key, data in zip(batch["keys"][:random_samples], batch["data"][:random_samples]):
            case = np.asarray(dataset.load_case(key)[0])
            torch.testing.assert_close(data, torch.from_numpy(case).float().reshape(data.shape), rtol=0, atol=0)


class _StandInEpochEnd:
    """What ``nnUNetTrainer.on_epoch_end`` uses of a trainer, recording what it writes and prints."""

    def __init__(self, epoch, num_epochs, save_every, best_ema, ema):
        self.current_epoch, self.num_epochs, self.save_every, self._best_ema = epoch, num_epochs, save_every, best_ema
        self.output_folder, self.local_rank, self.record = "out", 0, []
        values = {"train_losses": [0.5], "val_losses": [0.4], "dice_per_class_or_region": [[0.3, 0.2]],
                  "epoch_start_timestamps": [0.0], "epoch_end_timestamps": [], "ema_fg_dice": [ema]}
        stand_in = self

        class Logger:
            def log(self, key, value, epoch):
                values[key].append(value)

            def get_value(self, key, step):
                return values[key][step]

            def plot_progress_png(self, folder):
                stand_in.record.append(("plot", folder))

        self.logger = Logger()

    def print_to_log_file(self, *args):
        if not str(args[0]).startswith("Epoch time"):
            self.record.append(("log", " ".join(str(a) for a in args)))

    def save_checkpoint(self, filename):
        self.record.append(("save", filename, self.current_epoch))


@pytest.mark.parametrize("epoch, num_epochs, save_every, best_ema, ema", [
    (1, 10, 2, None, 0.3), (1, 10, 2, 0.5, 0.3), (2, 10, 2, 0.2, 0.3), (9, 10, 5, 0.2, 0.1)])
def test_epoch_end_does_what_nnunets_on_epoch_end_does(epoch, num_epochs, save_every, best_ema, ema):
    from nnunetv2_meddisseg.training.nnunet_copies import epoch_end

    theirs, ours = (_StandInEpochEnd(epoch, num_epochs, save_every, best_ema, ema) for _ in range(2))
    nnUNetTrainer.on_epoch_end(theirs)
    epoch_end(ours)
    assert ours.record == theirs.record and ours.record
    assert (ours.current_epoch, ours._best_ema) == (theirs.current_epoch, theirs._best_ema) == (
        epoch + 1, ema if best_ema is None or ema > best_ema else best_ema)
    # what the copy adds: more checkpoints of the finished epoch, and no best where the epoch may not become it
    held = _StandInEpochEnd(epoch, num_epochs, save_every, None, ema)
    epoch_end(held, ["checkpoint_latest.pth", "checkpoint_stage1.pth"], may_become_best=False)
    saved = [entry[1:] for entry in held.record if entry[0] == "save"]
    assert saved == [("out/checkpoint_latest.pth", epoch), ("out/checkpoint_stage1.pth", epoch)]
    assert held._best_ema is None and held.current_epoch == epoch + 1
