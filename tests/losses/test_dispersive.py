import math

import pytest
import torch

from nnunetv2_meddisseg.losses import dispersive as dispersive_module
from nnunetv2_meddisseg.losses.dispersive import (
    DISPERSIVE_VARIANTS,
    DispersiveLoss,
    dispersion_diagnostics,
    dispersive_loss,
)


def _reference(features: torch.Tensor, variant: str, tau: float, eps: float, margin: float) -> torch.Tensor:
    """Brute force in float64, one python iteration per ordered pair (or per covariance entry)."""
    h = features.double().reshape(features.shape[0], -1)
    b, d = h.shape
    pairs = [(i, j) for i in range(b) for j in range(b) if i != j]
    if variant == "infonce_l2":
        terms = [torch.exp(-((h[i] - h[j]) ** 2).sum() / d / tau) for i, j in pairs]
        return torch.log(sum(terms) / len(pairs) + eps)
    if variant == "infonce_cosine_centred":
        mean = sum(h[i] for i in range(b)) / b
        return _reference(torch.stack([h[i] - mean for i in range(b)]), "infonce_cosine", tau, eps, margin)
    if variant == "infonce_cosine":
        def norm(v):
            return torch.clamp(torch.sqrt((v * v).sum()), min=1e-12)
        terms = [torch.exp(-(1 - (h[i] * h[j]).sum() / (norm(h[i]) * norm(h[j]))) / tau) for i, j in pairs]
        return torch.log(sum(terms) / len(pairs) + eps)
    if variant == "hinge":
        terms = [torch.clamp(margin - torch.sqrt(((h[i] - h[j]) ** 2).sum()) / math.sqrt(d), min=0) ** 2
                 for i, j in pairs]
        return sum(terms) / len(pairs)
    assert variant == "covariance"
    mean = sum(h[i] for i in range(b)) / b
    total = h.new_zeros(())
    for p in range(d):
        for q in range(d):
            if p != q:
                c_pq = sum((h[i, p] - mean[p]) * (h[i, q] - mean[q]) for i in range(b)) / (b - 1)
                total = total + c_pq ** 2
    return total / (d * (d - 1)) if d > 1 else total


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
@pytest.mark.parametrize("shape", [(2, 3), (3, 1), (5, 2, 3, 2), (8, 17)])
def test_matches_float64_reference(variant, shape):
    torch.manual_seed(sum(shape))
    features = torch.randn(*shape) * 1.5 + 0.3
    for tau, eps, margin in [(0.8, 1e-8, 1.0), (0.3, 0.0, 1.6), (2.0, 1e-2, 0.5)]:
        ours = dispersive_loss(features, variant, tau=tau, eps=eps, margin=margin)
        expected = _reference(features, variant, tau, eps, margin)
        assert ours.dtype == torch.float32 and ours.ndim == 0
        torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_gradient_matches_float64_reference(variant):
    torch.manual_seed(1)
    features = torch.randn(4, 6)
    ours = features.clone().requires_grad_(True)
    dispersive_loss(ours, variant, tau=0.5, margin=1.8).backward()
    ref = features.double().requires_grad_(True)
    _reference(ref, variant, 0.5, 1e-8, 1.8).backward()
    assert ref.grad.abs().max() > 0
    torch.testing.assert_close(ours.grad.double(), ref.grad, rtol=1e-4, atol=1e-6)


def test_hand_computed_two_by_two():
    # h1 = (0, 0), h2 = (2, 0): ||h1 - h2||^2 = 4, D = 2 -> d = 2 for both ordered pairs.
    # infonce_l2, tau = 1, eps = 0: log((e^-2 + e^-2) / 2) = -2
    h = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert dispersive_loss(h, "infonce_l2", tau=1.0, eps=0.0).item() == pytest.approx(-2.0, abs=1e-6)
    # same with tau = 0.5, eps = 0.1: log(e^-4 + 0.1)
    assert dispersive_loss(h, "infonce_l2", tau=0.5, eps=0.1).item() == pytest.approx(math.log(math.exp(-4) + 0.1),
                                                                                     abs=1e-6)
    # hinge: d = ||(2, 0)|| / sqrt(2) = sqrt(2); margin 2 -> (2 - sqrt(2))^2 = 6 - 4 sqrt(2)
    assert dispersive_loss(h, "hinge", margin=2.0).item() == pytest.approx(6 - 4 * math.sqrt(2), abs=1e-6)
    # margin 1 < sqrt(2): inactive
    assert dispersive_loss(h, "hinge", margin=1.0).item() == 0.0
    # cosine: h1 = (1, 0), h2 = (1, 1): cos = 1/sqrt(2), d = 1 - 1/sqrt(2); tau = 0.5, eps = 0 -> -2 (1 - 1/sqrt(2))
    c = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert dispersive_loss(c, "infonce_cosine", tau=0.5, eps=0.0).item() == pytest.approx(-(2 - math.sqrt(2)), abs=1e-6)
    # covariance: h1 = (0, 0), h2 = (2, 4): centred rows (-1, -2), (1, 2); C = [[2, 4], [4, 8]] (B - 1 = 1)
    # off-diagonal sum of squares 4^2 + 4^2 = 32, mean over the D (D - 1) = 2 off-diagonal entries -> 16
    v = torch.tensor([[0.0, 0.0], [2.0, 4.0]])
    assert dispersive_loss(v, "covariance").item() == pytest.approx(16.0, abs=1e-5)


def test_covariance_value_does_not_depend_on_d():
    # The same per-dimension statistics at D, 4D and 16D: the features tiled along D. Tiling keeps every
    # covariance and only turns copies of the diagonal into off-diagonal entries, a share of about
    # (B + 1) / D of the off-diagonal mean for independent dimensions (2 % at B = 4, D = 256). A sum over
    # the entries divided by D (instead of their mean) would grow 4- and 16-fold.
    torch.manual_seed(3)
    h = torch.randn(4, 256)
    base = dispersive_loss(h, "covariance").item()
    for k in (4, 16):
        assert dispersive_loss(h.repeat(1, k), "covariance").item() == pytest.approx(base, rel=0.03)
    # independent unit-variance dimensions: E[C_pq^2] = 1 / (B - 1) for p != q, whatever D
    for d in (64, 16384):
        torch.manual_seed(d)
        expected = 1 / 3
        tolerance = 0.4 if d == 64 else 0.1  # fewer entries, more sampling noise
        assert dispersive_loss(torch.randn(4, d), "covariance").item() == pytest.approx(expected, rel=tolerance)


def test_gradient_alive_in_high_dimension():
    # D = 2^20 (the released code's failure case): with the 1/D normalisation, d_ij ~ 2 for N(0,1)
    torch.manual_seed(0)
    features = torch.randn(8, 2 ** 20)
    for variant, margin in [("infonce_l2", 1.0), ("infonce_cosine", 1.0), ("covariance", 1.0), ("hinge", 2.0)]:
        h = features.clone().requires_grad_(True)
        loss = dispersive_loss(h, variant, tau=0.8, margin=margin)
        (grad,) = torch.autograd.grad(loss, h)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), variant
        assert grad.abs().max() > 0, variant
    # not the underflowed constant log(eps)
    assert dispersive_loss(features, "infonce_l2").item() > math.log(1e-8) + 10
    # hinge distances are ~sqrt(2) > 1: with margin 1 the hinge is rightly inactive
    h = features.clone().requires_grad_(True)
    loss = dispersive_loss(h, "hinge", margin=1.0)
    (grad,) = torch.autograd.grad(loss, h)
    assert loss.item() == 0.0
    assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_single_sample_gives_connected_zero(variant):
    h = torch.randn(1, 4, 3, 3, requires_grad=True)
    loss = dispersive_loss(h, variant)
    assert loss.item() == 0.0 and loss.dtype == torch.float32
    assert loss.requires_grad
    loss.backward()
    assert h.grad is not None and h.grad.shape == h.shape and torch.count_nonzero(h.grad) == 0


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_give_fp32(variant, dtype):
    torch.manual_seed(2)
    h32 = torch.randn(6, 3, 5, 5) * 2
    low = h32.to(dtype).requires_grad_(True)
    loss = dispersive_loss(low, variant, margin=4.0)  # typical hinge distance here: 2 sqrt(2)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and loss != 0
    torch.testing.assert_close(loss, dispersive_loss(low.detach().float(), variant, margin=4.0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, dispersive_loss(h32, variant, margin=4.0), rtol=3e-2, atol=3e-2)
    loss.backward()
    assert low.grad.dtype == dtype and torch.isfinite(low.grad.float()).all()


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_autocast_does_not_lower_precision(variant):
    torch.manual_seed(3)
    h = torch.randn(6, 300) * 2 + 1
    expected = dispersive_loss(h, variant, margin=4.0)  # typical hinge distance here: 2 sqrt(2)
    assert expected != 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = dispersive_loss(h, variant, margin=4.0)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
@pytest.mark.parametrize("scale", [1e4, 1e-20])
def test_extreme_magnitudes_stay_finite(variant, scale):
    torch.manual_seed(4)
    h = (torch.randn(5, 40) * scale).requires_grad_(True)
    margin = 2.0 * scale  # keeps the hinge active
    loss = dispersive_loss(h, variant, margin=margin)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all()
    expected = _reference(h.detach(), variant, 0.8, 1e-8, margin)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("variant", ["infonce_l2", "infonce_cosine", "hinge"])
def test_bounded_variants_finite_for_huge_inputs(variant):
    h = (torch.randn(4, 10) * 1e30).requires_grad_(True)
    loss = dispersive_loss(h, variant)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all()


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_duplicate_and_zero_samples_have_finite_gradients(variant):
    h = torch.randn(4, 6)
    h[1] = h[0]
    h[3] = 0.0
    h.requires_grad_(True)
    loss = dispersive_loss(h, variant, margin=1.6)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(h.grad).all()
    torch.testing.assert_close(loss.double(), _reference(h.detach(), variant, 0.8, 1e-8, 1.6), rtol=1e-5, atol=1e-6)


def test_centred_cosine_not_lowered_by_shrinking_non_negative_features():
    # Non-negative features with a common part: uncentred cosine dispersion falls when the common part is
    # gated towards zero (the features shrink and become sparse); the centred form ignores the common part.
    torch.manual_seed(5)
    specific = torch.rand(6, 50) * (torch.rand(6, 50) < 0.2)
    common = torch.rand(1, 50)
    open_gate = specific + common
    uncentred = dispersive_loss(open_gate, "infonce_cosine")
    centred = dispersive_loss(open_gate, "infonce_cosine_centred")
    h = specific + 1e-3 * common
    assert dispersive_loss(h, "infonce_cosine") < uncentred - 0.1
    torch.testing.assert_close(dispersive_loss(h, "infonce_cosine_centred"), centred, rtol=1e-5, atol=1e-6)
    # and it is scale-invariant
    torch.testing.assert_close(dispersive_loss(h * 1e-4, "infonce_cosine_centred"), centred, rtol=1e-5, atol=1e-6)


def test_invalid_options_are_named():
    h = torch.randn(3, 4)
    with pytest.raises(ValueError, match="variant.*'l1'"):
        dispersive_loss(h, "l1")
    for tau in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="tau"):
            dispersive_loss(h, tau=tau)
    with pytest.raises(ValueError, match="eps"):
        dispersive_loss(h, eps=-1.0)
    with pytest.raises(ValueError, match="placement.*'decoder'"):
        DispersiveLoss(placement="decoder")
    with pytest.raises(ValueError, match="variant"):
        DispersiveLoss(variant="cos")


def _features(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return {"early": torch.randn(3, 4, 8, 8, generator=g), "middle": torch.randn(3, 16, 2, 2, generator=g),
            "late": torch.randn(3, 2, 16, 16, generator=g) * 0.5}


def test_module_placement():
    feats = _features()
    module = DispersiveLoss(variant="infonce_l2", tau=0.5, placement="middle")
    torch.testing.assert_close(module(feats), dispersive_loss(feats["middle"], tau=0.5))
    torch.testing.assert_close(module.of(feats["late"]), dispersive_loss(feats["late"], tau=0.5))
    every = DispersiveLoss(variant="hinge", margin=1.7, placement="all")
    expected = sum(dispersive_loss(feats[k], "hinge", margin=1.7) for k in ("early", "middle", "late")) / 3
    torch.testing.assert_close(every(feats), expected)
    assert "hinge" in repr(every) and "'all'" in repr(every)


def test_module_missing_feature_is_named():
    feats = _features()
    del feats["late"]
    with pytest.raises(ValueError, match="'late'"):
        DispersiveLoss(placement="all")(feats)
    with pytest.raises(ValueError, match="'late'"):
        DispersiveLoss(placement="late")(feats)
    assert torch.isfinite(DispersiveLoss(placement="early")(feats))


def test_diagnostics_mean_distance_matches_brute_force():
    torch.manual_seed(6)
    h = torch.randn(5, 3, 4) * 2 + 7
    flat = h.double().reshape(5, -1)
    pairs = [((flat[i] - flat[j]) ** 2).sum().item() / flat.shape[1] for i in range(5) for j in range(5) if i != j]
    diag = dispersion_diagnostics(h)
    assert isinstance(diag["mean_pairwise_distance"], float)
    assert diag["mean_pairwise_distance"] == pytest.approx(sum(pairs) / len(pairs), rel=1e-5)


def test_diagnostics_effective_rank():
    torch.manual_seed(7)
    # points on a line (plus an offset): the centred batch has rank 1
    line = torch.linspace(-2, 3, 6)[:, None] * torch.randn(1, 50) + 5 * torch.randn(1, 50)
    assert dispersion_diagnostics(line)["effective_rank"] == pytest.approx(1.0, abs=1e-4)
    # B one-hot rows: centring leaves B - 1 equal singular values (the all-ones direction is removed)
    one_hot = torch.eye(5, 9)
    assert dispersion_diagnostics(one_hot)["effective_rank"] == pytest.approx(4.0, abs=1e-4)
    # identical samples: nothing to spread
    assert dispersion_diagnostics(torch.ones(4, 10))["effective_rank"] == 0.0
    # random batch against an SVD of the centred matrix
    h = torch.randn(6, 40, requires_grad=True)
    centred = h.detach().double() - h.detach().double().mean(0)
    s = torch.linalg.svdvals(centred)
    p = s / s.sum()
    expected = math.exp(-(p * p.log()).sum().item())
    assert dispersion_diagnostics(h)["effective_rank"] == pytest.approx(expected, rel=1e-5)
    assert dispersion_diagnostics(h[:1]) == {"mean_pairwise_distance": 0.0, "effective_rank": 0.0}


# (covariance, fp16) is left out: its gradient grows with the cube of the feature scale (~1e12 at 1e4), beyond
# fp16's range whatever the loss does; its fp32 value at this scale is tested in test_extreme_magnitudes_stay_finite
AUTOCAST_LARGE_CASES = [(v, d) for v in DISPERSIVE_VARIANTS for d in (torch.bfloat16, torch.float16)
                        if (v, d) != ("covariance", torch.float16)]


@pytest.mark.parametrize("variant,dtype", AUTOCAST_LARGE_CASES)
def test_autocast_large_low_precision_features_finite(variant, dtype):
    # features of magnitude ~1e3..1e4 that a layer under CPU autocast produced in bf16 / fp16
    torch.manual_seed(6)
    layer = torch.nn.Linear(8, 40)
    x = torch.randn(5, 8) * 3e3
    try:
        with torch.autocast("cpu", dtype=dtype):
            h = layer(x)
            h.retain_grad()
            loss = dispersive_loss(h, variant, margin=2e4)  # a margin above the distances keeps the hinge active
    except RuntimeError as e:
        pytest.skip(f"CPU autocast does not support {dtype}: {e}")
    if h.dtype != dtype:
        pytest.skip(f"CPU autocast does not support {dtype} (the layer ran in {h.dtype})")
    assert 1e3 < h.abs().max() < 6e4
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and loss != 0
    expected = _reference(h.detach(), variant, 0.8, 1e-8, 2e4)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-4, atol=1e-6)
    loss.backward()
    assert h.grad.dtype == dtype and torch.isfinite(h.grad).all()
    # infonce_l2 saturates here (every exp(-d_ij / tau) underflows, the loss is log(eps)): its true gradient is 0
    assert (h.grad.abs().max() > 0) == (variant != "infonce_l2")


def test_diagnostics_convert_one_block_at_a_time(monkeypatch):
    # blocks of 6 values = 2 dimensions of a batch of 3: D = 40 takes 20 blocks, the last one partial
    torch.manual_seed(8)
    h = torch.randn(3, 5, 8) * 3 + 2
    whole = dispersion_diagnostics(h)
    monkeypatch.setattr(dispersive_module, "DIAGNOSTICS_BLOCK_ELEMENTS", 6)
    converted = []
    real_to = torch.Tensor.to

    def spying_to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        if out.dtype == torch.float64 and out.data_ptr() != self.data_ptr():
            converted.append(out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "to", spying_to)
    blocked = dispersion_diagnostics(h)
    monkeypatch.undo()
    assert converted and max(converted) <= 6  # never a float64 copy of the whole (3, 40) batch
    assert blocked["mean_pairwise_distance"] == pytest.approx(whole["mean_pairwise_distance"], rel=1e-9)
    assert blocked["effective_rank"] == pytest.approx(whole["effective_rank"], rel=1e-9)


@pytest.mark.parametrize("variant", DISPERSIVE_VARIANTS)
def test_minimum_batch_is_where_the_gradient_starts(variant):
    """MINIMUM_BATCH[variant] samples have a gradient, one fewer none (the centred cosine of two samples
    is the constant log(exp(-2 / tau) + eps))."""
    from nnunetv2_meddisseg.losses.dispersive import MINIMUM_BATCH

    torch.manual_seed(3)
    needed = MINIMUM_BATCH[variant]
    for b, alive in ((needed - 1, False), (needed, True)):
        features = (torch.randn(b, 6) * 0.3).requires_grad_(True)
        loss = dispersive_loss(features, variant, tau=0.8, margin=5.0)
        loss.backward()
        assert (features.grad.abs().max() > 1e-4) == alive, (b, features.grad)
    if variant == "infonce_cosine_centred":
        assert float(dispersive_loss(torch.randn(2, 6), variant, tau=0.8, eps=0.0)) == pytest.approx(-2.5)
