import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nnunetv2_meddisseg.blocks.decoder import CBATDecoder, MultiScaleCBATDecoder, PathHead


def _features(b=2, c=16, h=32, w=48):
    return [torch.randn(b, c, h // 2 ** (i + 1), w // 2 ** (i + 1)) for i in range(4)]


def test_cbat_decoder_shape():
    dec = CBATDecoder(16, 8, 12)
    assert dec(torch.randn(2, 16, 4, 6), torch.randn(2, 8, 8, 12)).shape == (2, 12, 8, 12)


def test_cbat_decoder_residual_steps():
    # F(t+1) = F(t) + CBT3x3(CBT1x1(F(t))): silencing the last norm of every step makes each step
    # add act(0) = 0, so the output must equal CBAT(F0)
    torch.manual_seed(0)
    dec = CBATDecoder(8, 8, 8).eval()
    coarse, fine = torch.randn(1, 8, 3, 3), torch.randn(1, 8, 6, 6)
    with torch.no_grad():
        f0 = dec.project(torch.cat([F.interpolate(coarse, size=(6, 6), mode="bilinear"), fine], 1))
        full = dec(coarse, fine)
        for step in dec.steps:
            step[1].norm.weight.zero_()
            step[1].norm.bias.zero_()
        torch.testing.assert_close(dec(coarse, fine), dec.cbat(f0))
        assert not torch.allclose(full, dec.cbat(f0))
    assert len(dec.steps) == 3
    assert [s[0].conv.kernel_size for s in dec.steps] == [(1, 1)] * 3
    assert [s[1].conv.kernel_size for s in dec.steps] == [(3, 3)] * 3


def test_path_head_upsamples_logits():
    head = PathHead(16, 3)
    assert head(torch.randn(2, 16, 4, 6), (32, 48)).shape == (2, 3, 32, 48)


def test_sum_fusion_is_sum_of_paths():
    torch.manual_seed(0)
    dec = MultiScaleCBATDecoder(16, 3, "sum").eval()
    with torch.no_grad():
        logits, paths, late = dec(_features(), (32, 48))
    assert logits.shape == (2, 3, 32, 48)
    assert len(paths) == 3 and all(p.shape == (2, 3, 32, 48) for p in paths)
    torch.testing.assert_close(logits, paths[0] + paths[1] + paths[2])
    assert late.shape == (2, 16, 16, 24)  # D_s at H/2


def test_concat_fusion():
    dec = MultiScaleCBATDecoder(16, 3, "concat")
    logits, paths, late = dec(_features(), (32, 48))
    assert logits.shape == (2, 3, 32, 48) and paths is None and late.shape == (2, 16, 16, 24)
    assert not hasattr(dec, "path_heads")


def test_bad_fusion():
    with pytest.raises(ValueError, match="decoder_fusion"):
        MultiScaleCBATDecoder(16, 2, "mean")


def test_relu_variant():
    dec = MultiScaleCBATDecoder(16, 2, nonlin=nn.ReLU)
    assert isinstance(dec.small.cbat.channel.mlp[1], nn.ReLU)
    assert dec(_features(), (32, 48))[0].shape == (2, 2, 32, 48)


def test_without_cbat_each_path_ends_in_a_plain_conv_block_of_the_same_width():
    from nnunetv2_meddisseg.blocks.attention import CBAT
    from nnunetv2_meddisseg.blocks.conv import ConvNormAct

    torch.manual_seed(0)
    dec = MultiScaleCBATDecoder(16, 2, cbat=False).eval()
    with_cbat = MultiScaleCBATDecoder(16, 2)
    assert not any(isinstance(m, CBAT) for m in dec.modules())
    for path in (dec.small, dec.medium, dec.large):
        assert isinstance(path.cbat, ConvNormAct)
        assert (path.cbat.conv.in_channels, path.cbat.conv.out_channels, path.cbat.conv.kernel_size) == (16, 16, (3, 3))
    # only the last unit of each path differs: CBAT's parameters are replaced by one conv + norm
    cbat_params = sum(p.numel() for p in with_cbat.small.cbat.parameters())
    plain_params = 16 * 16 * 9 + 2 * 16  # conv weight (no bias: the norm follows), norm weight + bias
    difference = sum(p.numel() for p in with_cbat.parameters()) - sum(p.numel() for p in dec.parameters())
    assert difference == 3 * (cbat_params - plain_params)
    coarse, fine = torch.randn(1, 16, 3, 3), torch.randn(1, 16, 6, 6)
    with torch.no_grad():
        x = dec.small.project(torch.cat([F.interpolate(coarse, size=(6, 6), mode="bilinear"), fine], 1))
        for step in dec.small.steps:
            x = x + step(x)
        torch.testing.assert_close(dec.small(coarse, fine), dec.small.cbat(x))
