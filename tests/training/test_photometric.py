import pytest
import torch

from nnunetv2_meddisseg.training.photometric import _gaussian_blur, photometric_perturbation


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(b: int, c: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    g = _gen(seed)
    smooth = torch.nn.functional.interpolate(torch.randn(b, c, 4, 4, generator=g), size=(size, size),
                                             mode="bilinear", align_corners=False)
    return (smooth + 0.3 * torch.randn(b, c, size, size, generator=g)) * 1.7 - 0.4  # z-score-like, any range


@pytest.mark.parametrize("c, rgb", [(3, True), (3, False), (1, False), (1, True), (4, True), (2, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_shape_dtype_range(c, rgb, dtype):
    x = _batch(3, c).to(dtype)
    out = photometric_perturbation(x, rgb, _gen(1))
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    assert torch.isfinite(out).all()
    dims = (1, 2, 3) if (rgb and c == 3) else (2, 3)
    low, high = x.float().amin(dim=dims, keepdim=True), x.float().amax(dim=dims, keepdim=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (out.float() >= low - tol).all() and (out.float() <= high + tol).all()
    # a strong perturbation, not the identity
    assert (out.float() - x.float()).abs().mean() > 0.02 * x.float().std()


@pytest.mark.parametrize("rgb", [True, False])
def test_seeded_generator_is_deterministic(rgb):
    x = _batch(4, 3)
    a = photometric_perturbation(x, rgb, _gen(7))
    b = photometric_perturbation(x, rgb, _gen(7))
    c = photometric_perturbation(x, rgb, _gen(8))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("c, rgb", [(3, True), (1, False), (4, False)])
def test_each_sample_gets_its_own_draw(c, rgb):
    x = _batch(1, c).expand(6, -1, -1, -1).contiguous()
    out = photometric_perturbation(x, rgb, _gen(3))
    for i in range(6):
        for j in range(i + 1, 6):
            assert (out[i] - out[j]).abs().max() > 1e-3, (i, j)


def test_equivariant_to_the_input_range():
    # mapped to [0, 1] by min / max and back: f(a x + b) = a f(x) + b for a > 0
    x = _batch(3, 3)
    for rgb in (True, False):
        out = photometric_perturbation(x, rgb, _gen(4))
        shifted = photometric_perturbation(25.0 * x + 300.0, rgb, _gen(4))
        torch.testing.assert_close(shifted, 25.0 * out + 300.0, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("rgb", [False, True])  # rgb=True with 4 channels is not RGB either
def test_non_rgb_channels_stay_independent(rgb):
    x = _batch(3, 4)
    out = photometric_perturbation(x, rgb, _gen(5))
    # each channel alone, with the same draws, gives the same result
    for k in range(4):
        alone = photometric_perturbation(x[:, k:k + 1], rgb, _gen(5))
        torch.testing.assert_close(out[:, k:k + 1], alone, rtol=1e-5, atol=1e-5)
    # replacing one channel by something of a very different range changes nothing elsewhere
    y = x.clone()
    y[:, 2] = 1000.0 * torch.randn_like(y[:, 2]) + 50.0
    out_y = photometric_perturbation(y, rgb, _gen(5))
    keep = [0, 1, 3]
    torch.testing.assert_close(out_y[:, keep], out[:, keep], rtol=0, atol=0)
    assert not torch.allclose(out_y[:, 2], out[:, 2])


def test_constant_channel_stays_constant():
    x = _batch(2, 3)
    x[:, 1] = 2.5
    out = photometric_perturbation(x, rgb=False, generator=_gen(6))
    assert torch.equal(out[:, 1], torch.full_like(out[:, 1], 2.5))
    assert torch.isfinite(out).all()


def test_rgb_path_mixes_colours_and_sometimes_goes_gray():
    x = _batch(64, 3, size=8)
    out = photometric_perturbation(x, rgb=True, generator=_gen(9))
    gray = ((out[:, 0] - out[:, 1]).abs().amax(dim=(1, 2)) < 1e-5) & \
           ((out[:, 1] - out[:, 2]).abs().amax(dim=(1, 2)) < 1e-5)
    # grayscale is drawn per sample with a small probability: some samples, not all
    assert 1 <= int(gray.sum()) <= 40
    # colour operations couple the channels: changing red changes the green output
    y = x.clone()
    y[:, 0] = -y[:, 0]
    assert not torch.allclose(photometric_perturbation(y, True, _gen(9))[:, 1], out[:, 1])


def test_no_gradient_and_input_untouched():
    x = _batch(2, 3).requires_grad_(True)
    before = x.detach().clone()
    out = photometric_perturbation(x, rgb=True)
    assert not out.requires_grad
    assert torch.equal(x.detach(), before)


def test_gaussian_blur_is_a_separable_normalised_gaussian():
    impulse = torch.zeros(2, 1, 9, 9)
    impulse[:, :, 4, 4] = 1.0
    sigma = torch.tensor([0.5, 1.5])
    out = _gaussian_blur(impulse, sigma)
    for i, s in enumerate(sigma.tolist()):
        t = torch.arange(-3, 4, dtype=torch.float32)
        g = torch.exp(-0.5 * (t / s) ** 2)
        g = g / g.sum()
        torch.testing.assert_close(out[i, 0, 1:8, 1:8], torch.outer(g, g))
        assert out[i].sum().item() == pytest.approx(1.0, abs=1e-6)


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="B, C, H, W"):
        photometric_perturbation(torch.zeros(3, 8, 8), rgb=True)
    with pytest.raises(ValueError, match="float"):
        photometric_perturbation(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), rgb=True)
