import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.enhancement import FeatureEnhancement


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
