"""``recalibrate_batchnorm``: running statistics re-estimated for the current weights."""
import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.training.batchnorm_statistics import batchnorm_layers, recalibrate_batchnorm


def _conv_bn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Conv2d(3, 2, 1),
                         nn.BatchNorm2d(2))


def test_running_mean_is_the_exact_mean_and_var_the_mean_of_batch_variances():
    net = _conv_bn()
    batches = [torch.randn(4, 2, 5, 5) * 3 + 1 for _ in range(3)]
    conv_out = [net[0](b).detach() for b in batches]
    net[1].running_mean.fill_(100.0)
    net.eval()
    assert recalibrate_batchnorm([net], batches, net) == 2
    expected_mean = torch.stack([o.mean(dim=(0, 2, 3)) for o in conv_out]).mean(0)
    expected_var = torch.stack([o.transpose(0, 1).reshape(3, -1).var(dim=1, unbiased=True) for o in conv_out]).mean(0)
    torch.testing.assert_close(net[1].running_mean, expected_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(net[1].running_var, expected_var, rtol=1e-5, atol=1e-5)
    assert not net.training and not net[1].training  # modes restored
    assert net[1].momentum == 0.1  # momentum restored


def test_weights_and_other_modes_are_unchanged():
    net = _conv_bn()
    net.train()
    net[3].eval()  # a mixed state must come back as it was
    weights = {k: v.clone() for k, v in net.state_dict().items() if "running" not in k and "num_batches" not in k}
    recalibrate_batchnorm([net], [torch.randn(2, 2, 4, 4)], net)
    for k, v in weights.items():
        assert torch.equal(net.state_dict()[k], v), k
    assert net.training and net[1].training and not net[3].training


def test_layers_the_forward_does_not_reach_keep_their_statistics():
    net = _conv_bn()
    net[4].running_mean.fill_(7.0)
    reached = recalibrate_batchnorm([net], [torch.randn(2, 2, 4, 4)], lambda x: net[1](net[0](x)))
    assert reached == 1
    assert torch.all(net[4].running_mean == 7.0)
    assert int(net[4].num_batches_tracked) == 0


def test_no_batches_is_an_error_and_changes_nothing():
    net = _conv_bn()
    net[1].running_mean.fill_(3.0)
    with pytest.raises(ValueError, match="no calibration batches"):
        recalibrate_batchnorm([net], [], net)
    assert torch.all(net[1].running_mean == 3.0) and net[1].momentum == 0.1


def test_networks_without_batchnorm_are_left_alone():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2, affine=True))
    assert batchnorm_layers([net]) == []
    assert recalibrate_batchnorm([net], [torch.randn(1, 1, 5, 5)], net) == 0


def test_stale_statistics_predict_a_training_batch_worse_than_recalibrated_ones():
    """The failure the re-estimation fixes: weights that moved while the running averages trailed them. Here
    the running statistics are those of the untrained network and the weights have moved since; in
    evaluation mode the network then disagrees with its own training-mode output on its training batch."""
    torch.manual_seed(0)
    net = MedDisSegNet(3, 2, deep_supervision=False, elat=False, activation="relu")
    batch = torch.randn(8, 3, 64, 64)
    recalibrate_batchnorm([net], [batch], net)  # statistics of the untrained weights
    with torch.no_grad():
        for p in net.parameters():  # "training" moves the weights
            p.mul_(1.5).add_(0.05 * torch.randn_like(p))
        net.train()
        reference = net(batch)  # what the weights predict with their own batch statistics

        def errors():
            net.eval()
            logits = net(batch)
            return ((logits.argmax(1) == reference.argmax(1)).float().mean().item(),
                    (logits - reference).abs().mean().item())

        stale_agreement, stale_error = errors()
        recalibrate_batchnorm([net], [batch], net)
        agreement, error = errors()
    assert agreement > stale_agreement + 0.1
    assert error < 1e-3 * stale_error
    assert error < reference.abs().mean().item()
