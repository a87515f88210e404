import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.attention import ChannelAttention
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement
from reference_impls import previous_channel_attention, previous_enhancement_forward


@pytest.mark.parametrize("in_channels,size", [(64, (16, 16)), (256, (8, 12)), (1024, (2, 2))])
def test_shape(in_channels, size):
    fe = FeatureEnhancement(in_channels, 128)
    assert fe(torch.randn(2, in_channels, *size)).shape == (2, 128, *size)


def test_structure_and_parameter_count():
    fe = FeatureEnhancement(64, 128)
    assert [b[0].conv.dilation for b in fe.branches] == [(1, 1), (6, 6), (12, 12), (18, 18)]
    assert isinstance(fe.fuse.nonlin, nn.Identity) and isinstance(fe.shortcut.nonlin, nn.Identity)
    assert isinstance(fe.nonlin, TeLU)
    ca = 2 * 128 * 8  # channel attention, ratio 16, no bias
    expected = (64 * 128 + 256 + ca) + 3 * (64 * 128 * 9 + 256 + ca) + (512 * 128 * 9 + 256) + (64 * 128 + 256) + 98
    assert sum(p.numel() for p in fe.parameters()) == expected


def test_activation_before_spatial_attention():
    # with ReLU, act(fuse + shortcut) >= 0 and the spatial attention only rescales by (0, 1)
    torch.manual_seed(0)
    fe = FeatureEnhancement(32, 16, nonlin=nn.ReLU)
    y = fe(torch.randn(2, 32, 12, 12))
    assert (y >= 0).all() and (y > 0).any()


@pytest.mark.parametrize("nonlin", [TeLU, nn.ReLU])
@pytest.mark.parametrize("training", [False, True])
def test_equals_previous_implementation_values_and_gradients(nonlin, training):
    # one activation and one batched channel attention for all branches == each branch on its own (float64)
    torch.manual_seed(0)
    fe = FeatureEnhancement(24, 32, nonlin=nonlin).double().train(training)
    results = []
    for forward in (fe, lambda t: previous_enhancement_forward(fe, t)):
        fe.zero_grad()
        x = torch.randn(2, 24, 9, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        y = forward(x)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape)).sum().backward()
        results.append([y.detach(), x.grad] + [p.grad.clone() for p in fe.parameters()])
    for ours, ref in zip(*results):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_channel_attention_equals_previous_with_and_without_bias():
    torch.manual_seed(0)
    for bias in (False, True):
        ca = ChannelAttention(32, 4, bias=bias).double()
        x = torch.randn(3, 32, 5, 6, dtype=torch.float64)
        torch.testing.assert_close(ca.attention(x), previous_channel_attention(ca, x), rtol=1e-12, atol=1e-14)
