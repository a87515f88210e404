import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU, telu
from nnunetv2_meddisseg.blocks.attention import CBAT, ELAT, ChannelAttention, SpatialAttention


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _randomise(m: nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)


def _mlp_ref(x, l1: nn.Module, l2: nn.Module, act):
    """The MLP as Linear layers on rows x (N, C) (the layers' weights may be stored as 1x1 kernels)"""
    h = x @ l1.weight.flatten(1).T + (l1.bias if l1.bias is not None else 0)
    h = act(h)
    return h @ l2.weight.flatten(1).T + (l2.bias if l2.bias is not None else 0)


@pytest.mark.parametrize("shape", [(2, 32, 8, 8), (1, 64, 5, 7)])
def test_shapes_preserved(shape):
    x = torch.randn(shape)
    c = shape[1]
    for module in (ChannelAttention(c), SpatialAttention(), CBAT(c), ELAT(c)):
        assert module(x).shape == shape


def test_channel_attention_matches_manual():
    torch.manual_seed(0)
    ca = ChannelAttention(32, reduction=8, nonlin=TeLU).double()
    _randomise(ca)
    x = torch.randn(2, 32, 6, 5, dtype=torch.float64)
    l1, l2 = ca.mlp[0], ca.mlp[2]
    avg = x.mean(dim=(2, 3))
    mx = x.flatten(2).max(dim=2).values
    a = torch.sigmoid(_mlp_ref(avg, l1, l2, telu) + _mlp_ref(mx, l1, l2, telu))
    torch.testing.assert_close(ca(x), x * a[:, :, None, None])


def test_spatial_attention_matches_manual():
    sa = SpatialAttention(7, bias=True).double()
    _randomise(sa)
    x = torch.randn(2, 16, 9, 11, dtype=torch.float64)
    pooled = torch.stack([x.mean(1), x.max(1).values], dim=1)
    a = torch.sigmoid(F.conv2d(pooled, sa.conv.weight, sa.conv.bias, padding=3))
    torch.testing.assert_close(sa(x), x * a)


def test_cbat_is_channel_then_spatial():
    cbat = CBAT(32, reduction=16).double()
    _randomise(cbat, seed=3)
    x = torch.randn(2, 32, 8, 8, dtype=torch.float64)
    # reference: CBAM order, spatial attention computed on the channel-attended tensor
    l1, l2 = cbat.channel.mlp[0], cbat.channel.mlp[2]
    a_c = torch.sigmoid(_mlp_ref(x.mean((2, 3)), l1, l2, telu) + _mlp_ref(x.amax((2, 3)), l1, l2, telu))
    y = x * a_c[:, :, None, None]
    pooled = torch.stack([y.mean(1), y.max(1).values], dim=1)
    a_s = torch.sigmoid(F.conv2d(pooled, cbat.spatial.conv.weight, cbat.spatial.conv.bias, padding=3))
    torch.testing.assert_close(cbat(x), y * a_s)


def test_cbat_parameter_count_and_neutral_weights():
    cbat = CBAT(128)
    # Linear 128->8 (+b), 8->128 (+b), 7x7 conv 2->1 (+b): the 2,283 parameters of the reference CBAM
    assert _n_params(cbat) == 2283
    with torch.no_grad():
        for p in cbat.parameters():
            p.zero_()
    x = torch.randn(2, 128, 4, 4)
    torch.testing.assert_close(cbat(x), 0.25 * x)  # both attentions sigmoid(0) = 0.5


def test_cbat_uses_chosen_activation():
    assert isinstance(CBAT(32, nonlin=nn.ReLU).channel.mlp[1], nn.ReLU)
    assert isinstance(CBAT(32).channel.mlp[1], TeLU)


def test_elat_matches_manual_parallel_branches():
    elat = ELAT(32, reduction=8).double()
    _randomise(elat, seed=5)
    x = torch.randn(2, 32, 10, 12, dtype=torch.float64)
    l1, l2 = elat.channel_mlp[0], elat.channel_mlp[2]
    assert l1.bias is None and l2.bias is None and l1.out_channels == 4
    a_c = torch.sigmoid(_mlp_ref(x.mean((2, 3)), l1, l2, telu))[:, :, None, None]
    maps = [F.conv2d(x, conv.weight, conv.bias, padding=d, dilation=d)
            for conv, d in zip(elat.spatial_convs, (1, 2, 3))]
    a_s = torch.sigmoid(F.conv2d(torch.cat(maps, 1), elat.spatial_fuse.weight, elat.spatial_fuse.bias))
    # both attentions are computed from x (parallel), not one after the other
    torch.testing.assert_close(elat(x), x * a_c * a_s)


def test_elat_spatial_branch_is_multi_scale():
    torch.manual_seed(0)
    elat = ELAT(4)
    assert [c.dilation for c in elat.spatial_convs] == [(1, 1), (2, 2), (3, 3)]
    # an impulse reaches exactly 3 pixels away through the dilation-3 branch
    x = torch.zeros(1, 4, 15, 15)
    x[0, :, 7, 7] = 1.0
    a_s = elat.spatial_attention(x)
    base = torch.sigmoid(elat.spatial_fuse.bias + sum(elat.spatial_fuse.weight.flatten()[i] * c.bias[0]
                                                       for i, c in enumerate(elat.spatial_convs)))
    changed = (a_s[0, 0] - base).abs() > 1e-7
    assert changed[7, 10] and changed[4, 7] and changed[7, 9] and changed[7, 8]
    assert not changed[7, 11] and not changed[7, 12]


def test_elat_parameter_count():
    # channel MLP 2*C*C/8 (no bias) + three 3x3 convs C->1 (+b) + 1x1 fuse 3->1 (+b)
    c = 256
    assert _n_params(ELAT(c)) == 2 * c * c // 8 + 3 * (9 * c + 1) + 4


def test_invalid_arguments():
    with pytest.raises(ValueError):
        SpatialAttention(kernel_size=4)
    with pytest.raises(ValueError):
        ELAT(16, reduction=0)
