"""nnUNetTrainerMedDisSeg re-estimates BatchNorm's statistics before every validation (and so before every
checkpoint), without changing a weight or the training's random numbers."""
import pytest
import torch
from test_trainer_meddisseg import make_batch, make_trainer, run_epoch

from nnunetv2_meddisseg.training.batchnorm_statistics import recalibrate_batchnorm
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2


def _stem_statistics_of(trainer, data: torch.Tensor):
    """Independent reference: the batch mean and unbiased variance of the stem convolution's output."""
    with torch.no_grad():
        out = trainer.network.encoder.conv1(data)
    return out.mean(dim=(0, 2, 3)), out.transpose(0, 1).reshape(out.shape[1], -1).var(dim=1)


@pytest.mark.parametrize("epochs, stage", [(1, STAGE_1), (2, STAGE_2)])
def test_validation_normalises_with_statistics_of_the_current_weights(nnunet_dirs, epochs, stage):
    trainer = make_trainer()
    calibration = trainer._draw_batchnorm_calibration_batches()[0]
    for _ in range(epochs):
        run_epoch(trainer, make_batch())
    assert trainer.training_stage == stage
    mean, var = _stem_statistics_of(trainer, calibration)
    bn = trainer.network.encoder.bn1
    torch.testing.assert_close(bn.running_mean, mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bn.running_var, var, rtol=1e-4, atol=1e-5)
    assert bn.momentum == 0.1 and not bn.training


def test_without_re_estimation_the_running_averages_trail(nnunet_dirs):
    trainer = make_trainer(batchnorm_calibration_samples=0)
    calibration = make_trainer()._draw_batchnorm_calibration_batches()[0]
    run_epoch(trainer, make_batch())
    mean, _ = _stem_statistics_of(trainer, calibration)
    assert (trainer.network.encoder.bn1.running_mean - mean).abs().max() > 1e-2  # the test can tell them apart


def test_re_estimation_changes_no_weight_and_equals_re_estimating_afterwards(nnunet_dirs, monkeypatch):
    monkeypatch.setenv("nnUNet_meddisseg_seed", "3")
    with_it, without = make_trainer(), make_trainer(batchnorm_calibration_samples=0)
    for epoch in range(2):  # across the stage switch
        for trainer in (with_it, without):
            run_epoch(trainer, make_batch(seed=epoch))
    params_with = dict(with_it.network.named_parameters())
    for name, p in without.network.named_parameters():
        assert torch.equal(p, params_with[name]), name
    buffers_with = dict(with_it.network.named_buffers())
    network = without.network
    recalibrate_batchnorm([network], with_it._draw_batchnorm_calibration_batches(),
                          lambda x: without.stage.validation_logits(network, x, plain=True))
    for name, b in network.named_buffers():
        if "running" in name:
            torch.testing.assert_close(b, buffers_with[name], rtol=1e-5, atol=1e-6, msg=name)


def test_resumed_run_re_estimates_the_same_statistics(nnunet_dirs, tmp_path):
    trainer = make_trainer()
    run_epoch(trainer, make_batch())
    trainer.on_train_epoch_start()  # Stage II
    trainer.on_validation_epoch_start()
    checkpoint = str(tmp_path / "checkpoint.pth")
    trainer.save_checkpoint(checkpoint)
    resumed = make_trainer()
    resumed.load_checkpoint(checkpoint)
    saved = {k: v.clone() for k, v in resumed.network.named_buffers() if "running" in k}
    resumed.on_validation_epoch_start()
    for name, b in resumed.network.named_buffers():
        if name in saved:
            torch.testing.assert_close(b, saved[name], rtol=1e-5, atol=1e-6, msg=name)
    assert "BatchNorm statistics of" in open(resumed.log_file).read()
