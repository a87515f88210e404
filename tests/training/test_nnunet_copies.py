"""The nnU-Net code copied into ``nnunet_copies`` is pinned to the installed nnU-Net's source, and the copy
writes what nnU-Net's own method writes."""
import importlib
import math

import pytest
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

from nnunetv2_meddisseg.training.nnunet_copies import PINNED, checkpoint_entries, source_hash
from test_trainer_meddisseg import make_batch, make_trainer, nnunet_dirs, run_epoch  # noqa: F401 (fixture)


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
