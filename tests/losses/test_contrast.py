import math

import pytest
import torch

from nnunetv2_meddisseg.losses.contrast import (
    complementarity_loss,
    consistency_loss,
    dice_bce_loss,
    foreground_background_loss,
    soft_dice_loss,
)


def _map(values):
    """Four pixels as a (1, 1, 2, 2) map."""
    return torch.tensor(values, dtype=torch.float32).view(1, 1, 2, 2)


def test_soft_dice_hand_computed():
    # intersection 1, |p| = 2, |t| = 2, smooth 1: dice = (2 + 1) / (4 + 1) = 0.6
    assert soft_dice_loss(_map([1, 0, 1, 0]), _map([1, 1, 0, 0])).item() == pytest.approx(0.4)
    # empty prediction on empty target: perfect
    assert soft_dice_loss(_map([0, 0, 0, 0]), _map([0, 0, 0, 0])).item() == pytest.approx(0.0)
    # per sample, then averaged: a perfect sample (0) and the sample above (0.4)
    p = torch.cat([_map([1, 1, 0, 0]), _map([1, 0, 1, 0])])
    t = torch.cat([_map([1, 1, 0, 0]), _map([1, 1, 0, 0])])
    assert soft_dice_loss(p, t).item() == pytest.approx(0.2)


def test_dice_bce_hand_computed():
    # logits 0 -> p = 0.5: BCE = log 2; target (1, 0, 1, 1): I = 1.5, |p| = 2, |t| = 3 -> dice (3 + 1) / (5 + 1)
    loss = dice_bce_loss(_map([0, 0, 0, 0]), _map([1, 0, 1, 1]))
    assert loss.item() == pytest.approx(math.log(2) + 1 / 3, abs=1e-6)


def test_foreground_background_hand_computed():
    target = _map([1, 0, 1, 1])
    zeros = _map([0, 0, 0, 0])
    # fg vs t: log 2 + 1/3 ; bg vs 1 - t = (0, 1, 0, 0): I = 0.5, |p| = 2, |t| = 1 -> dice 2/4 -> log 2 + 1/2
    loss = foreground_background_loss(zeros, zeros, target)
    assert loss.item() == pytest.approx(2 * math.log(2) + 1 / 3 + 1 / 2, abs=1e-6)


def test_foreground_background_leaves_ignored_pixels_out():
    # two pixels; the second carries the ignore label (mask 0) and confident, wrong logits
    fg = torch.tensor([0.0, 5.0]).view(1, 1, 1, 2)
    bg = torch.tensor([0.0, -5.0]).view(1, 1, 1, 2)
    target = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2)
    mask = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2)
    # pixel 1 alone, p = 0.5 in both maps. fg vs 1: BCE log 2, dice (2 * 0.5 + 1) / (0.5 + 1 + 1) = 0.8;
    # bg vs 0: BCE log 2, dice (0 + 1) / (0.5 + 0 + 1) = 2/3
    expected = 2 * math.log(2) + (1 - 0.8) + (1 - 2 / 3)
    assert foreground_background_loss(fg, bg, target, mask).item() == pytest.approx(expected, abs=1e-6)
    # the same as the first pixel on its own
    alone = foreground_background_loss(fg[..., :1], bg[..., :1], target[..., :1])
    assert alone.item() == pytest.approx(expected, abs=1e-6)
    # as a background pixel instead, the second one costs (mostly its fg BCE of about 5 / 2)
    assert foreground_background_loss(fg, bg, target).item() > expected + 2
    # nothing labelled: no loss
    assert foreground_background_loss(fg, bg, target, torch.zeros_like(mask)).item() == 0.0
    with pytest.raises(ValueError, match="same shape"):
        foreground_background_loss(fg, bg, target, mask[..., :1])


def test_foreground_background_perfect_and_swapped():
    torch.manual_seed(0)
    target = (torch.rand(2, 1, 8, 8) > 0.5).float()
    confident = 20.0 * (2 * target - 1)
    assert foreground_background_loss(confident, -confident, target).item() < 1e-5
    assert foreground_background_loss(-confident, confident, target).item() > 10
    with pytest.raises(ValueError, match="same shape"):
        foreground_background_loss(confident, confident, target[:, :, :4])


def test_complementarity_hand_computed():
    zeros = torch.zeros(1, 1, 1, 2)
    # equal logits: p = 1/3 each, 3 pairs * 1/9 = 1/3
    assert complementarity_loss(zeros, zeros, zeros).item() == pytest.approx(1 / 3)
    # logits (0, log 2, 0): p = (1/4, 1/2, 1/4) -> 1/8 + 1/16 + 1/8 = 5/16 ; pixel 2 equal logits -> 1/3
    bg = torch.tensor([math.log(2), 0.0]).view(1, 1, 1, 2)
    assert complementarity_loss(zeros, bg, zeros).item() == pytest.approx((5 / 16 + 1 / 3) / 2)
    # one map claims every pixel: ~0
    assert complementarity_loss(zeros + 30, zeros, zeros).item() < 1e-10
    # symmetric in its three arguments
    a, b, c = torch.randn(3, 2, 1, 4, 4).unbind(0)
    torch.testing.assert_close(complementarity_loss(a, b, c), complementarity_loss(c, a, b))


def test_consistency_hand_computed_multiclass_and_binary():
    # a = (0, 1) -> argmax 1 ; b = (2, 0) -> argmax 0
    # CE(a, 0) = log(1 + e) ; CE(b, 1) = log(e^2 + 1)
    a = torch.tensor([0.0, 1.0]).view(1, 2, 1, 1).requires_grad_(True)
    b = torch.tensor([2.0, 0.0]).view(1, 2, 1, 1)
    expected = math.log(1 + math.e) + math.log(1 + math.e ** 2)
    loss = consistency_loss(a, b)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # the targets are detached: a's gradient is only that of CE(a, argmax b) = softmax(a) - onehot(0)
    loss.backward()
    expected_grad = torch.softmax(a.detach(), dim=1) - torch.tensor([1.0, 0.0]).view(1, 2, 1, 1)
    torch.testing.assert_close(a.grad, expected_grad)
    # K = 1: logits 1 and -2; BCE(1, [-2 > 0] = 0) = log(1 + e), BCE(-2, [1 > 0] = 1) = log(1 + e^2)
    loss1 = consistency_loss(torch.tensor([1.0]).view(1, 1, 1, 1), torch.tensor([-2.0]).view(1, 1, 1, 1))
    assert loss1.item() == pytest.approx(expected, abs=1e-6)


def test_consistency_agreeing_and_symmetric():
    torch.manual_seed(1)
    labels = torch.randint(0, 4, (2, 6, 6))
    logits = 30.0 * torch.nn.functional.one_hot(labels, 4).permute(0, 3, 1, 2).float()
    assert consistency_loss(logits, logits.clone()).item() < 1e-3
    x, y = torch.randn(2, 2, 3, 5, 5).unbind(0)
    torch.testing.assert_close(consistency_loss(x, y), consistency_loss(y, x))
    with pytest.raises(ValueError, match="same shape"):
        consistency_loss(x, y[:, :2])


def test_low_precision_inputs_give_fp32():
    torch.manual_seed(2)
    fg, bg, uc = torch.randn(3, 2, 1, 8, 8).to(torch.bfloat16).unbind(0)
    target = (torch.rand(2, 1, 8, 8) > 0.5).float()
    for value in (foreground_background_loss(fg, bg, target), complementarity_loss(fg, bg, uc),
                  consistency_loss(fg, bg)):
        assert value.dtype == torch.float32 and value.ndim == 0 and torch.isfinite(value)


def test_foreground_background_is_the_sum_of_the_two_maps_terms():
    torch.manual_seed(1)
    fg, bg = torch.randn(2, 3, 1, 6, 5, dtype=torch.float64).unbind(0)
    target = (torch.rand(3, 1, 6, 5) > 0.6).double()
    for mask in (None, (torch.rand(3, 1, 6, 5) > 0.3).double()):
        expected = dice_bce_loss(fg, target, mask=mask) + dice_bce_loss(bg, 1 - target, mask=mask)
        torch.testing.assert_close(foreground_background_loss(fg, bg, target, mask), expected.float())


def test_complementarity_equals_the_pairwise_products():
    torch.manual_seed(2)
    maps = (torch.randn(3, 2, 1, 7, 7) * 3).unbind(0)
    p = torch.softmax(torch.stack(maps), dim=0)
    pairwise = (p[0] * p[1] + p[0] * p[2] + p[1] * p[2]).mean()
    torch.testing.assert_close(complementarity_loss(*maps), pairwise)
