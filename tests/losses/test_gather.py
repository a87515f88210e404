"""The gathered dispersive loss in 2 and 3 CPU processes (gloo) against one process holding the whole batch."""
import math
from pathlib import Path

import pytest
import torch
from distributed import spawn
from scratch import scratch_folder
from torch import distributed as dist

from nnunetv2_meddisseg.losses import (
    DISPERSIVE_PLACEMENTS,
    DISPERSIVE_VARIANTS,
    MINIMUM_BATCH,
    DispersiveLoss,
    dispersive_loss,
    gather_batch,
)

#: per world size, how the batch is split between the processes (1 per process included)
SPLITS = {2: [(1, 1), (3, 2)], 3: [(1, 1, 1), (2, 1, 2)]}
OPTIONS = {"tau": 0.5, "eps": 1e-8, "margin": 6.0}  # a margin every pair lies within: hinge active


def _batch(total: int, seed: int = 0):
    """inputs X (total, 4) and the weights W (4, 2, 3) of a linear layer; features = X @ W, (total, 2, 3)."""
    g = torch.Generator().manual_seed(seed + total)
    return torch.randn(total, 4, generator=g), torch.randn(4, 2, 3, generator=g)


def _features(x, w):
    return torch.einsum("bi,ijk->bjk", x, w)


def _rows(split, rank):
    start = sum(split[:rank])
    return slice(start, start + split[rank])


def _worker(rank, world_size, folder):
    results = {}
    for split in SPLITS[world_size]:
        x, w = _batch(sum(split))
        for variant in DISPERSIVE_VARIANTS:
            for gather in (True, False):
                own_w = w.clone().requires_grad_(True)
                features = _features(x[_rows(split, rank)], own_w)
                features.retain_grad()
                batch = gather_batch(features) if gather else features
                loss = dispersive_loss(batch, variant, **OPTIONS)
                loss.backward()
                results[(split, variant, gather)] = (loss.detach(), features.grad, own_w.grad)
        # the module: every placement, gathered and not
        maps = {name: _features(x[_rows(split, rank)], w * (i + 1)) for i, name in enumerate(DISPERSIVE_PLACEMENTS)}
        for gather in (True, False):
            module = DispersiveLoss("infonce_l2", placement="all", gather=gather, **OPTIONS)
            results[(split, "module", gather)] = module(maps).detach()
    # features that differ beyond the batch dimension are refused on every process
    try:
        gather_batch(torch.zeros(1, 2 + rank))
    except ValueError as error:
        results["mismatch"] = str(error)
    torch.save(results, Path(folder) / f"rank{rank}.pt")


@pytest.fixture(scope="module", params=sorted(SPLITS))
def gathered(request, tmp_path_factory):
    """Per rank, the results of ``_worker`` in a process group of ``request.param`` processes."""
    world_size = request.param
    folder = scratch_folder(request, tmp_path_factory, f"gather{world_size}")
    spawn(_worker, world_size, str(folder))
    return world_size, [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_gathered_loss_is_the_loss_of_the_concatenated_batch(gathered, variant):
    world_size, per_rank = gathered
    for split in SPLITS[world_size]:
        x, w = _batch(sum(split))
        w = w.clone().requires_grad_(True)
        features = _features(x, w)
        features.retain_grad()
        expected = dispersive_loss(features, variant, **OPTIONS)
        expected.backward()
        for rank, results in enumerate(per_rank):
            value, feature_grad, _ = results[(split, variant, True)]
            torch.testing.assert_close(value, expected.detach())
            # each process's own rows get world_size x the gradient (DDP divides the sum by world_size)
            torch.testing.assert_close(feature_grad, world_size * features.grad[_rows(split, rank)])
        # what DDP does with the processes' parameter gradients, their mean, is the single-process gradient
        mean = torch.stack([results[(split, variant, True)][2] for results in per_rank]).mean(dim=0)
        torch.testing.assert_close(mean, w.grad)


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_local_form_disperses_each_share_on_its_own(gathered, variant):
    world_size, per_rank = gathered
    for split in SPLITS[world_size]:
        x, w = _batch(sum(split))
        for rank, results in enumerate(per_rank):
            value, feature_grad, _ = results[(split, variant, False)]
            own = _features(x[_rows(split, rank)], w).requires_grad_(True)
            expected = dispersive_loss(own, variant, **OPTIONS)
            expected.backward()
            torch.testing.assert_close(value, expected.detach())
            torch.testing.assert_close(feature_grad, own.grad)


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_one_sample_per_process_still_disperses(gathered, variant):
    world_size, per_rank = gathered
    split = (1,) * world_size
    for results in per_rank:
        gathered_grad = results[(split, variant, True)][2]
        local_value, _, local_grad = results[(split, variant, False)]
        assert local_value == 0.0 and torch.count_nonzero(local_grad) == 0  # one sample: no pair
        if world_size >= MINIMUM_BATCH[variant]:
            assert gathered_grad.abs().max() > 1e-4
        else:  # the centred cosine of two samples is a constant (their centred features are opposites)
            assert variant == "infonce_cosine_centred" and gathered_grad.abs().max() < 1e-6


def test_module_gathers_every_placement(gathered):
    world_size, per_rank = gathered
    for split in SPLITS[world_size]:
        x, w = _batch(sum(split))
        whole = {name: _features(x, w * (i + 1)) for i, name in enumerate(DISPERSIVE_PLACEMENTS)}
        module = DispersiveLoss("infonce_l2", placement="all", gather=False, **OPTIONS)
        expected = module(whole)
        for rank, results in enumerate(per_rank):
            torch.testing.assert_close(results[(split, "module", True)], expected)
            own = {k: v[_rows(split, rank)] for k, v in whole.items()}
            torch.testing.assert_close(results[(split, "module", False)], module(own))


def test_features_of_different_sizes_are_refused(gathered):
    world_size, per_rank = gathered
    for results in per_rank:
        assert "differ beyond the batch dimension" in results["mismatch"]
        assert str([(1, 2 + r) for r in range(world_size)]) in results["mismatch"]


def test_without_a_process_group_the_batch_is_unchanged():
    assert not dist.is_initialized()
    x = torch.randn(2, 3)
    assert gather_batch(x) is x
    assert math.isfinite(float(DispersiveLoss(gather=True)({"early": x})))
