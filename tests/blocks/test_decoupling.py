import pytest
import torch
from merged_check import assert_merged_equals_previous, build, randomised
from reference_impls import PreviousAuxiliaryHeads, PreviousFeatureDecoupling

from nnunetv2_meddisseg.blocks.decoupling import AuxiliaryHeads, FeatureDecoupling


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
    assert [m[0].conv.kernel_size for m in (dec.fg_bg, dec.uc)] == [(3, 3)] * 2


def test_auxiliary_heads_full_resolution_logits():
    heads = AuxiliaryHeads(128)
    ys = heads(*(torch.randn(2, 128, 3, 5) for _ in range(3)))
    assert [y.shape for y in ys] == [(2, 1, 48, 80)] * 3  # four x2 up-samplings: H/16 -> H
    assert not any(isinstance(m, torch.nn.Sigmoid) for m in heads.modules())
    assert sum(p.numel() for p in heads.parameters()) == 3 * 1_291_841  # 3.876 M as in the reference


def test_auxiliary_heads_custom_depth():
    heads = AuxiliaryHeads(8, channels=(16, 8))
    assert [y.shape for y in heads(*(torch.randn(1, 8, 4, 4) for _ in range(3)))] == [(1, 1, 8, 8)] * 3


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("with_uncertainty", [True, False])
def test_decoupling_equals_separate_branches(training, with_uncertainty):
    """The merged fg / bg stack against the three separate branches (their weights merged into it)."""
    torch.manual_seed(0)
    old = randomised(build(PreviousFeatureDecoupling, 16, 8, 4)).train(training)
    assert_merged_equals_previous(old, FeatureDecoupling(16, 8, 4), [torch.randn(2, 16, 3, 5)],
                                  call=lambda m, x: m(x, with_uncertainty=with_uncertainty))


@pytest.mark.parametrize("training", [True, False])
def test_auxiliary_heads_equal_separate_heads(training):
    """The grouped heads against three separate heads (their weights merged into it)."""
    torch.manual_seed(0)
    old = randomised(build(PreviousAuxiliaryHeads, 8, (16, 8, 4))).train(training)
    assert_merged_equals_previous(old, AuxiliaryHeads(8, (16, 8, 4)), [torch.randn(2, 8, 3, 5) for _ in range(3)])
