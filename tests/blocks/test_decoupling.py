import torch

from nnunetv2_meddisseg.blocks.decoupling import AuxiliaryHead, FeatureDecoupling


def test_decoupling_shapes_and_independent_branches():
    torch.manual_seed(0)
    dec = FeatureDecoupling(64, 32, 16)
    x = torch.randn(2, 64, 4, 6)
    f_fg, f_bg, f_uc = dec(x)
    assert f_fg.shape == f_bg.shape == f_uc.shape == (2, 16, 4, 6)
    assert not torch.allclose(f_fg, f_bg) and not torch.allclose(f_fg, f_uc)
    fg2, bg2, uc2 = dec(x, with_uncertainty=False)
    assert uc2 is None
    dec.eval()
    torch.testing.assert_close(dec(x)[0], dec(x, with_uncertainty=False)[0])


def test_decoupling_reference_parameter_count():
    # three branches CBT3x3 1024->512, CBT3x3 512->128, CBT1x1 128->128: 15.979 M
    dec = FeatureDecoupling(1024, 512, 128)
    per_branch = 1024 * 512 * 9 + 1024 + 512 * 128 * 9 + 256 + 128 * 128 + 256
    assert sum(p.numel() for p in dec.parameters()) == 3 * per_branch == 15_979_008
    assert [m[0].conv.kernel_size for m in dec.branches.values()] == [(3, 3)] * 3


def test_auxiliary_head_full_resolution_logits():
    head = AuxiliaryHead(128)
    y = head(torch.randn(2, 128, 3, 5))
    assert y.shape == (2, 1, 48, 80)  # four x2 up-samplings: H/16 -> H
    assert not any(isinstance(m, torch.nn.Sigmoid) for m in head.modules())
    assert sum(p.numel() for p in head.parameters()) == 1_291_841  # 3 heads: 3.876 M as in the reference


def test_auxiliary_head_custom_depth():
    head = AuxiliaryHead(8, channels=(16, 8))
    assert head(torch.randn(1, 8, 4, 4)).shape == (1, 1, 8, 8)
