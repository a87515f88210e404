import pytest
import torch

from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation, ContrastGuidancePyramid, GuidanceBranch


def _linear(layer, x):
    # x: (..., C_in)
    return x @ layer.weight.T + layer.bias


def _brute_force_window(m: ContrastDrivenAggregation, values, guidance, layer):
    """Per-pixel loop: every window writes A[h, i, j] * v(p + off_j) to pixel p + off_i."""
    b_, c, h, w = values.shape
    k, r = m.kernel_size, m.kernel_size // 2
    win, nh, hd = k * k, m.num_heads, c // m.num_heads
    out = torch.zeros_like(values)
    for b in range(b_):
        for y in range(h):
            for x in range(w):
                logits = _linear(layer, guidance[b, :, y, x]).reshape(nh, win, win) * m.scale
                a = torch.softmax(logits, dim=-1)
                for i in range(win):
                    oy, ox = y + i // k - r, x + i % k - r
                    if not (0 <= oy < h and 0 <= ox < w):
                        continue
                    for j in range(win):
                        sy, sx = y + j // k - r, x + j % k - r
                        if not (0 <= sy < h and 0 <= sx < w):
                            continue  # zero padding
                        out[b, :, oy, ox] += a[:, i, j].repeat_interleave(hd) * values[b, :, sy, sx]
    return _linear(m.proj, out.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _brute_force_cdfa(m, x, fg, bg):
    x = m.input_convs(x)
    v = _linear(m.value, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    y = _brute_force_window(m, v, fg, m.attn_fg)
    y = _brute_force_window(m, y, bg, m.attn_bg)
    return m.output_convs(y)


@pytest.mark.parametrize(
    "in_channels,dim,heads,size", [(256, 128, 4, (4, 4)), (8, 16, 2, (3, 5))]
)
def test_matches_brute_force(in_channels, dim, heads, size):
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(in_channels, dim, heads).double().eval()
    with torch.no_grad():
        # sharpen the generated attention so that a wrong window index would show
        for layer in (m.attn_fg, m.attn_bg):
            layer.weight.mul_(20)
        x = torch.randn(2, in_channels, *size, dtype=torch.float64)
        fg = torch.randn(2, dim, *size, dtype=torch.float64)
        bg = torch.randn(2, dim, *size, dtype=torch.float64)
        ours = m(x, fg, bg)
        ref = _brute_force_cdfa(m, x, fg, bg)
    assert ours.shape == (2, dim, *size)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_fg_and_bg_guidance_both_matter():
    torch.manual_seed(0)
    m = ContrastDrivenAggregation(16, 16, 4).eval()
    x, fg, bg = torch.randn(1, 16, 6, 6), torch.randn(1, 16, 6, 6), torch.randn(1, 16, 6, 6)
    with torch.no_grad():
        y = m(x, fg, bg)
        assert not torch.allclose(y, m(x, torch.randn_like(fg), bg))
        assert not torch.allclose(y, m(x, fg, torch.randn_like(bg)))


def test_reference_parameter_count():
    # CDFA4 (128 in) + three CDFAs with 256 in: 3.272 M in the reference
    total = sum(p.numel() for p in ContrastDrivenAggregation(128).parameters())
    total += 3 * sum(p.numel() for p in ContrastDrivenAggregation(256).parameters())
    assert total == 3_272_224


def test_invalid_arguments():
    with pytest.raises(ValueError, match="divisible"):
        ContrastDrivenAggregation(16, 18, 4)
    with pytest.raises(ValueError, match="odd"):
        ContrastDrivenAggregation(16, 16, 4, kernel_size=2)


def test_guidance_pyramid_shapes():
    pyr = ContrastGuidancePyramid(16, 16, (3, 2, 1, 0))
    f_fg, f_bg = torch.randn(2, 16, 2, 3), torch.randn(2, 16, 2, 3)
    out = pyr(f_fg, f_bg)
    assert [tuple(fg.shape) for fg, _ in out] == [(2, 16, 16, 24), (2, 16, 8, 12), (2, 16, 4, 6), (2, 16, 2, 3)]
    assert all(fg.shape == bg.shape for fg, bg in out)
    assert len(GuidanceBranch(16, 16, 3).up_convs) == 3
    # the reference's CDFA pre-processing: 20 Conv3x3-BN-act blocks of 128 channels = 2.954 M
    assert sum(p.numel() for p in ContrastGuidancePyramid(128, 128).parameters()) == 20 * (128 * 128 * 9 + 256)
