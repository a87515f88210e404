import pytest
import torch
from merged_check import assert_merged_equals_previous, build, randomised
from reference_impls import PreviousFeatureEnhancement, previous_channel_attention
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.attention import ChannelAttention
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement


@pytest.mark.parametrize("in_channels,size", [(64, (16, 16)), (256, (8, 12)), (1024, (2, 2))])
def test_shape(in_channels, size):
    fe = FeatureEnhancement(in_channels, 128)
    assert fe(torch.randn(2, in_channels, *size)).shape == (2, 128, *size)


def test_structure_and_parameter_count():
    fe = FeatureEnhancement(64, 128)
    assert [c.dilation for c in fe.dilated] == [(6, 6), (12, 12), (18, 18)]
    assert fe.pointwise.kernel_size == (1, 1) and isinstance(fe.fuse.nonlin, nn.Identity)
    assert isinstance(fe.nonlin, TeLU)
    ca = 2 * 128 * 8  # channel attention, ratio 16, no bias
    expected = (64 * 128 + 256 + ca) + 3 * (64 * 128 * 9 + 256 + ca) + (512 * 128 * 9 + 256) + (64 * 128 + 256) + 98
    assert sum(p.numel() for p in fe.parameters()) == expected
    assert sum(p.numel() for p in PreviousFeatureEnhancement(64, 128).parameters()) == expected


def test_activation_before_spatial_attention():
    # with ReLU, act(fuse + shortcut) >= 0 and the spatial attention only rescales by (0, 1)
    torch.manual_seed(0)
    fe = FeatureEnhancement(32, 16, nonlin=nn.ReLU)
    y = fe(torch.randn(2, 32, 12, 12))
    assert (y >= 0).all() and (y > 0).any()


@pytest.mark.parametrize("nonlin", [TeLU, nn.ReLU])
@pytest.mark.parametrize("training", [False, True])
def test_equals_separate_branches_values_and_gradients(nonlin, training):
    """The merged block (one norm, one activation, one batched channel attention) against the separate
    branches and shortcut run one by one (their weights merged into it)."""
    torch.manual_seed(0)
    old = randomised(build(PreviousFeatureEnhancement, 24, 32, nonlin=nonlin)).train(training)
    assert_merged_equals_previous(old, FeatureEnhancement(24, 32, nonlin=nonlin), [torch.randn(2, 24, 9, 7)])


def test_channel_attention_equals_previous_with_and_without_bias():
    torch.manual_seed(0)
    for bias in (False, True):
        ca = ChannelAttention(32, 4, bias=bias).double()
        x = torch.randn(3, 32, 5, 6, dtype=torch.float64)
        torch.testing.assert_close(ca.attention(x), previous_channel_attention(ca, x), rtol=1e-12, atol=1e-14)
