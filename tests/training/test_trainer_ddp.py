"""The trainers under DDP, in 2 CPU processes joined by gloo, and the start-up line about small batches.

nnU-Net's ``run_ddp`` hard-codes NCCL and CUDA: here every process builds the trainer in a gloo
process group and is moved to the CPU before ``initialize`` (device, no GradScaler, nnU-Net's DDP
wrapper without ``device_ids``). PyTorch's SyncBatchNorm runs on GPUs only, so BatchNorm layers stay
per-process (their running statistics are rank 0's, broadcast by DDP at every forward); everything
else is the trainer's own DDP path, fed in-memory batches through the hooks nnU-Net's
``run_training`` calls.
"""
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import spawn
from scratch import scratch_folder
from test_trainer_meddisseg import DATASET, MEDDISSEG, PLAIN_UNET, make_batch, make_trainer, tiny_plans
from torch import distributed as dist

from nnunetv2_meddisseg.losses import dispersion_diagnostics, dispersive_loss
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_smoke

pytestmark = pytest.mark.e2e  # several processes (the quick loop leaves it out)

WORLD_SIZE = 2
RUN_SEED = 123  # the same initial weights in every trainer of a test


def _on_cpu_under_gloo():
    """Let nnU-Net's DDP path run on CPU processes (see the module docstring)."""
    import nnunetv2.training.nnUNetTrainer.nnUNetTrainer as nnunet_trainer_module
    ddp = nnunet_trainer_module.DDP
    nnunet_trainer_module.DDP = lambda module, device_ids=None, **kwargs: ddp(module, **kwargs)
    torch.nn.SyncBatchNorm.convert_sync_batchnorm = classmethod(lambda cls, module, process_group=None: module)


def _cpu_trainer(cls, plans, **attributes):
    trainer = make_trainer(cls, plans=plans, initialize=False, **attributes)
    assert trainer.is_ddp and trainer.device.type == "cuda"  # what nnU-Net sets under DDP
    trainer.device = torch.device("cpu")
    trainer.grad_scaler = None
    trainer.initialize()
    return trainer


def _flat_weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainer._plain_network().parameters()])


def _same_on_every_rank(tensor: torch.Tensor) -> bool:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


def _epoch(trainer, batch) -> dict:
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    output = trainer.train_step(batch)
    trainer.on_train_epoch_end([output])
    with torch.no_grad():
        trainer.on_validation_epoch_start()
        trainer.on_validation_epoch_end([trainer.validation_step(batch)])
    trainer.on_epoch_end()
    return output


def _meddisseg_worker(rank, world_size, folder):
    from nnunetv2_meddisseg.training import objectives as objectives_module
    from nnunetv2_meddisseg.training import trainer_base as base_module
    from nnunetv2_meddisseg.training.photometric import photometric_perturbation
    from nnunetv2_meddisseg.training.seeding import seed_epoch

    _on_cpu_under_gloo()
    saved = []
    save = base_module.save_checkpoint_file
    base_module.save_checkpoint_file = lambda obj, filename: saved.append(Path(filename).name) or save(obj, filename)
    perturbed = []
    perturb = objectives_module.photometric_perturbation
    objectives_module.photometric_perturbation = lambda x, rgb: perturbed.append(perturb(x, rgb=rgb)) or perturbed[-1]

    results = {}
    plans = tiny_plans(MEDDISSEG)
    plans["configurations"]["2d"]["batch_size"] = 2 * world_size
    trainer = _cpu_trainer(nnUNetTrainerMedDisSeg_smoke, plans)
    results["batch_size"] = trainer.batch_size
    results["run_seed_shared"] = _same_on_every_rank(torch.tensor([trainer.run_seed]))
    results["initial_weights_shared"] = _same_on_every_rank(_flat_weights(trainer))
    batches = [make_batch(b=2, seed=10 * epoch + rank) for epoch in range(3)]
    outputs = []
    for epoch in range(2):  # Stage I, then Stage II
        outputs.append(_epoch(trainer, batches[epoch]))
        results[f"stage_{epoch}"] = trainer.training_stage
        results[f"groups_{epoch}"] = [(g["name"], g["lr"], len(g["params"])) for g in trainer.optimizer.param_groups]
        results[f"weights_shared_{epoch}"] = _same_on_every_rank(_flat_weights(trainer))
    results["outputs"] = outputs
    results["curves"] = {k: [trainer.logger.get_value(k, step=e) for e in range(2)]
                         for k in ("loss_seg", "loss_dispersive", "grad_norm_encoder", "dispersion_effective_rank")}
    results["saved"] = sorted(set(saved))

    # Stage I's perturbation: drawn from the epoch's per-rank stream, so replayed by the same seeds
    seed_epoch(trainer.run_seed, 0, rank)
    replay = photometric_perturbation(batches[0]["data"], rgb=True)
    results["perturbation_replayed"] = torch.equal(replay, perturbed[0])
    seed_epoch(trainer.run_seed, 0, rank)
    probe = photometric_perturbation(make_batch(b=2, seed=99)["data"], rgb=True)
    results["perturbation_shared"] = _same_on_every_rank(probe)

    # --c: every rank reads rank 0's checkpoint_latest.pth (written after epoch 1) and continues alike
    dist.barrier()
    resumed = _cpu_trainer(nnUNetTrainerMedDisSeg_smoke, plans)
    resumed.load_checkpoint(str(Path(trainer.output_folder) / "checkpoint_latest.pth"))
    results["resumed_stage"] = resumed.training_stage
    results["resumed_weights_equal"] = torch.equal(_flat_weights(resumed), _flat_weights(trainer))
    _epoch(trainer, batches[2])
    _epoch(resumed, batches[2])
    results["continued_weights_equal"] = torch.equal(_flat_weights(resumed), _flat_weights(trainer))
    results["continued_weights_shared"] = _same_on_every_rank(_flat_weights(resumed))

    # a batch with NaN on rank 1 only: the error is raised there and names the case and the rank
    bad = make_batch(b=2, seed=rank)
    if rank == 1:
        bad["data"][1, 0, 3, 3] = float("nan")
    try:
        trainer._batch_to_device(bad)
        results["nan_error"] = None
    except RuntimeError as error:
        results["nan_error"] = str(error)
    torch.save(results, Path(folder) / f"rank{rank}.pt")


def _dispersive_worker(rank, world_size, folder):
    """One step of nnUNetTrainerDispersive (nnU-Net's PlainConvUNet) with one sample per process, gathered
    and not."""
    _on_cpu_under_gloo()
    plans = tiny_plans(PLAIN_UNET)
    plans["configurations"]["2d"]["batch_size"] = world_size
    results = {}
    for gather in (True, False):
        trainer = _cpu_trainer(nnUNetTrainerDispersive, plans, dispersive_gather=gather,
                               dispersive_variant="infonce_l2", run_seed=RUN_SEED)
        trainer.on_train_epoch_start()
        batch = make_batch(b=1, seed=rank)
        batch["target"] = [batch["target"], batch["target"][:, :, ::2, ::2]]
        captured = []
        trainer._regularised_module().register_forward_hook(lambda m, i, o: captured.append(o.detach().clone()))
        output = trainer.train_step(batch)
        everyone = [torch.empty_like(captured[0]) for _ in range(world_size)]
        dist.all_gather(everyone, captured[0])
        results[gather] = {"loss_dispersive": output["loss_dispersive"],
                           "expected": float(dispersive_loss(torch.cat(everyone), "infonce_l2", 0.8)),
                           "diagnostics": output["dispersion_effective_rank"],
                           "expected_diagnostics": dispersion_diagnostics(torch.cat(everyone))["effective_rank"],
                           "weights_shared": _same_on_every_rank(_flat_weights(trainer)),
                           "weights": _flat_weights(trainer)}
    torch.save(results, Path(folder) / f"rank{rank}.pt")


def _spawned(worker, folder: Path):
    spawn(worker, WORLD_SIZE, str(folder))
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def meddisseg_ranks(request, tmp_path_factory):
    """Per rank, the results of ``_meddisseg_worker`` (one run shared by the tests that read it)."""
    root = scratch_folder(request, tmp_path_factory, "ddp")
    preprocessed = root / "preprocessed" / DATASET / "nnUNetPlans_2d"
    preprocessed.mkdir(parents=True)
    (preprocessed / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    with pytest.MonkeyPatch.context() as monkeypatch:  # the spawned processes inherit the environment
        monkeypatch.setenv("nnUNet_preprocessed", str(root / "preprocessed"))
        monkeypatch.setenv("nnUNet_results", str(root / "results"))
        monkeypatch.delenv("nnUNet_meddisseg_seed", raising=False)
        return _spawned(_meddisseg_worker, root)


def test_meddisseg_ddp_steps_across_the_stage_switch(meddisseg_ranks):
    ranks = meddisseg_ranks
    for results in ranks:
        assert results["batch_size"] == 2  # nnU-Net's split of the plans' batch of 4
        assert results["run_seed_shared"] and results["initial_weights_shared"]
        # the stage switch and the optimizer rebuild happen on every rank, alike
        assert (results["stage_0"], results["stage_1"]) == (STAGE_1, STAGE_2)
        assert results["groups_1"] == ranks[0]["groups_1"] and results["groups_0"] != results["groups_1"]
        assert results["weights_shared_0"] and results["weights_shared_1"]
    for epoch in range(2):
        # the dispersive term disperses the batch of both ranks: one value; the segmentation loss is each rank's own
        dispersive = [r["outputs"][epoch]["loss_dispersive"] for r in ranks]
        seg = [r["outputs"][epoch]["loss_seg"] for r in ranks]
        assert dispersive[0] == dispersive[1] and seg[0] != seg[1]
        # the epoch's curves are the mean over the ranks, on every rank
        for results in ranks:
            assert results["curves"]["loss_seg"][epoch] == pytest.approx(np.mean(seg))
            assert results["curves"]["loss_dispersive"][epoch] == pytest.approx(dispersive[0])
            for key in ("grad_norm_encoder", "dispersion_effective_rank"):  # the same on every rank
                values = [r["outputs"][epoch][key] for r in ranks]
                assert values[0] == pytest.approx(values[1])
                assert results["curves"][key][epoch] == pytest.approx(values[0])


def test_meddisseg_ddp_checkpoints_seeds_and_errors(meddisseg_ranks):
    rank0, rank1 = meddisseg_ranks
    assert rank0["saved"] == ["checkpoint_best.pth", "checkpoint_latest.pth"] and rank1["saved"] == []
    for results in (rank0, rank1):
        assert results["perturbation_replayed"]  # reproducible on resume
        assert not results["perturbation_shared"]  # different on the two ranks
        assert results["resumed_stage"] == STAGE_2 and results["resumed_weights_equal"]
        assert results["continued_weights_equal"] and results["continued_weights_shared"]
    assert rank0["nan_error"] is None
    assert "on rank 1: case_001" in rank1["nan_error"]


def test_dispersive_trainer_ddp_with_one_sample_per_rank(nnunet_dirs, tmp_path):
    ranks = _spawned(_dispersive_worker, tmp_path)
    for results in ranks:
        gathered, local = results[True], results[False]
        assert gathered["loss_dispersive"] == pytest.approx(gathered["expected"], rel=1e-5)
        assert gathered["loss_dispersive"] < 0  # two samples: pairs to disperse
        assert gathered["diagnostics"] == pytest.approx(gathered["expected_diagnostics"])
        assert local["loss_dispersive"] == 0.0  # one sample per rank: nothing to disperse
        assert gathered["weights_shared"] and local["weights_shared"]

    # nnU-Net's network normalises per sample (InstanceNorm) and its batch Dice is gathered under DDP, so the
    # DDP step with the gathered dispersive loss is the single-process step on the concatenated batch
    plans = tiny_plans(PLAIN_UNET)
    plans["configurations"]["2d"]["batch_size"] = WORLD_SIZE
    single = make_trainer(nnUNetTrainerDispersive, plans=plans, dispersive_variant="infonce_l2", run_seed=RUN_SEED)
    shares = [make_batch(b=1, seed=rank) for rank in range(WORLD_SIZE)]
    target = torch.cat([b["target"] for b in shares])
    batch = {"data": torch.cat([b["data"] for b in shares]), "target": [target, target[:, :, ::2, ::2]],
             "keys": [k for b in shares for k in b["keys"]]}
    single.on_train_epoch_start()
    output = single.train_step(batch)
    assert output["loss_dispersive"] == pytest.approx(ranks[0][True]["loss_dispersive"], rel=1e-5)
    torch.testing.assert_close(ranks[0][True]["weights"], _flat_weights(single), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ranks[0][False]["weights"], _flat_weights(single), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------- start-up line
@pytest.mark.parametrize("variant, batch_size, warns", [
    ("infonce_cosine_centred", 2, True), ("infonce_cosine_centred", 3, False), ("infonce_l2", 2, False),
    ("infonce_l2", 1, True), ("covariance", 2, False)])
def test_startup_line_when_the_batch_is_too_small_for_the_form(nnunet_dirs, monkeypatch, variant, batch_size, warns):
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    monkeypatch.setattr(nnUNetTrainer, "on_train_start", lambda self: None)  # no dataloaders here
    plans = tiny_plans(PLAIN_UNET)
    plans["configurations"]["2d"]["batch_size"] = batch_size
    trainer = make_trainer(nnUNetTrainerDispersive, plans=plans, dispersive_variant=variant)
    trainer.on_train_start()
    log = Path(trainer.log_file).read_text()
    line = f"WARNING: the dispersive loss ({variant}) sees {batch_size} sample(s) per step but needs at least"
    assert (line in log) == warns
    if warns and variant == "infonce_cosine_centred":
        assert "needs at least 3" in log and "nnUNetTrainerDispersive_cosine" in log
