"""The pretraining methods besides restoration: SparK-style masking and its loss against hand-computed cases,
NT-Xent against a brute-force formula, the views of one image, and both methods through the command: the loss
decreases and the file reaches nnU-Net's network and Med-DisSeg's encoder (contrastive: nnU-Net's decoder as
initialised)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_dataset import DATASET, meddisseg_plans, tiny_dataset

from nnunetv2_meddisseg.pretraining.contrastive import nt_xent
from nnunetv2_meddisseg.pretraining.masking import MASK_RATIO, PATCHES_PER_SIDE, mask_patches, masked_loss
from nnunetv2_meddisseg.pretraining.pretrain import METHODS, BatchSampler, main


def _pretrain(output, *extra: str) -> int:
    return main(["-d", DATASET, "-f", "0", "-o", str(output), "--device", "cpu", "--no_progress", *extra])


def test_masking_hides_whole_patches_at_the_ratio_and_is_seeded():
    batch = torch.randn(4, 3, 60, 48) + 5  # no pixel is 0 before masking; 60 = 10 whole patches of 6
    masked, mask = mask_patches(batch, torch.Generator().manual_seed(1))
    side = 48 // PATCHES_PER_SIDE
    patches = mask.reshape(4, 60 // side, side, 48 // side, side)
    corners = patches[:, :, :1, :, :1]
    assert torch.equal(patches, corners.expand_as(patches))  # constant within each patch
    assert torch.all(corners.sum(dim=(1, 2, 3, 4)) == round(MASK_RATIO * (60 // side) * (48 // side)))
    assert torch.equal(masked == 0, mask.bool().expand_as(masked))
    assert not torch.equal(mask[0], mask[1])  # each image its own patches
    again = mask_patches(batch, torch.Generator().manual_seed(1))
    assert torch.equal(again[1], mask) and not torch.equal(mask_patches(batch, torch.Generator().manual_seed(2))[1],
                                                            mask)


def test_masked_loss_counts_the_hidden_pixels_only():
    target = torch.zeros(1, 2, 2, 2)
    mask = torch.tensor([[[[1.0, 0.0], [0.0, 0.0]]]])
    restored = torch.zeros(1, 2, 2, 2)
    restored[0, :, 1, 1] = 100.0  # visible: not counted
    restored[0, 0, 0, 0], restored[0, 1, 0, 0] = 3.0, 1.0  # hidden: (9 + 1) / 2
    assert masked_loss(restored, target, mask).item() == pytest.approx(5.0)


def test_nt_xent_matches_the_brute_force_formula():
    z = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    u = [v / v.norm() for v in z]
    tau, n, total = 0.2, 3, 0.0
    for i in range(6):
        twin = (i + n) % 6
        others = sum(math.exp(float(u[i] @ u[k]) / tau) for k in range(6) if k != i)
        total += -math.log(math.exp(float(u[i] @ u[twin]) / tau) / others)
    assert nt_xent(z, tau).item() == pytest.approx(total / 6, rel=1e-5)


def test_pairs_are_two_views_of_the_same_images():
    images = [lambda v=v: np.full((1, 20, 20), float(v), np.float32) for v in range(1, 9)]
    sampler = BatchSampler(images, (16, 16), batch_size=3)
    sampler.transforms = lambda image, segmentation: {"image": image[:, :16, :16]}  # no augmentation: values tell
    np.random.seed(0)
    views = sampler.pairs()
    assert views.shape == (6, 1, 16, 16)
    values = views[:, 0, 8, 8]
    assert torch.equal(values[:3], values[3:]) and len(set(values[:3].tolist())) > 1


@pytest.mark.parametrize("method", ["masked", "contrastive"])
def test_method_loss_decreases_and_file_loads_through_nnunet(nnunet_dirs, tmp_path, method):
    import json

    from nnunetv2.run.load_pretrained_weights import load_pretrained_weights
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    folder = tiny_dataset(nnunet_dirs)
    output = tmp_path / f"{method}.pth"
    assert _pretrain(output, "--method", method, "--epochs", "6", "--iterations_per_epoch", "15", "--seed", "4") == 0
    saved = torch.load(output, map_location="cpu", weights_only=True)
    record = saved["pretraining"]
    assert record["method"] == METHODS[method] and record["network"] == "nnunet_network"
    assert np.mean(record["losses"][-3:]) < 0.9 * record["losses"][0], record["losses"]

    architecture = json.loads((folder / "nnUNetPlans.json").read_text())["configurations"]["2d"]["architecture"]
    network = get_network_from_plans(architecture["network_class_name"], architecture["arch_kwargs"],
                                     architecture["_kw_requires_import"], 3, 2, deep_supervision=True)
    load_pretrained_weights(network, str(output))
    pretrained, loaded = saved["network_weights"], network.state_dict()
    assert set(loaded) == set(pretrained)  # the whole network, no projection or restoration head
    for key in (k for k in loaded if ".seg_layers." not in k):
        assert torch.equal(loaded[key], pretrained[key]), key

    # what learnt: the encoder always; the decoder only where the method restores images
    torch.manual_seed(4)  # the command's seed: its initialisation
    initial = get_network_from_plans(architecture["network_class_name"], architecture["arch_kwargs"],
                                     architecture["_kw_requires_import"], 3, 3, allow_init=True,
                                     deep_supervision=False).state_dict()
    moved = {k for k in initial if k.endswith("weight") and not torch.equal(initial[k], pretrained[k])}
    own_decoder = {k for k in moved if k.startswith("decoder.") and not k.startswith("decoder.encoder.")}
    assert any(k.startswith("encoder.") for k in moved)  # (the decoder holds the encoder as decoder.encoder)
    assert bool(own_decoder) == (method == "masked")


@pytest.mark.parametrize("method", ["masked", "contrastive"])
def test_method_writes_the_meddisseg_encoder(nnunet_dirs, tmp_path, method):
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder

    tiny_dataset(nnunet_dirs)
    meddisseg_plans()
    output = tmp_path / "encoder.pth"
    assert _pretrain(output, "-p", "nnUNetMedDisSegPlans", "--method", method, "--epochs", "1",
                     "--iterations_per_epoch", "2") == 0
    saved = torch.load(output, map_location="cpu", weights_only=True)
    assert saved["pretraining"]["method"] == METHODS[method]
    assert set(saved["network_weights"]) == {f"encoder.{k}" for k in ResNet50Encoder(3).state_dict()}
