"""The light Stage I head (blocks.stage1_head): shapes, and that every level reaches the logits."""
import pytest
import torch

from nnunetv2_meddisseg.blocks.stage1_head import Stage1Head


def _features(b=2, size=32, channels=(64, 256, 512, 1024)):
    return [torch.randn(b, c, size // 2 ** (i + 1), size // 2 ** (i + 1), requires_grad=True)
            for i, c in enumerate(channels)]


def test_shapes_default_output_size():
    torch.manual_seed(0)
    head = Stage1Head(num_classes=3)
    logits, fused = head(_features())
    assert logits.shape == (2, 3, 32, 32)
    assert fused.shape == (2, 4 * 64, 32, 32)


def test_explicit_output_size_and_width():
    head = Stage1Head(num_classes=2, width=16)
    logits, fused = head(_features(size=64), output_size=(64, 64))
    assert logits.shape == (2, 2, 64, 64)
    assert fused.shape == (2, 64, 64, 64)


def test_every_level_gets_a_gradient():
    torch.manual_seed(0)
    features = _features(size=32, channels=(4, 8, 8, 16))
    head = Stage1Head(num_classes=2, in_channels=(4, 8, 8, 16), width=8)
    logits, _ = head(features)
    logits.square().mean().backward()
    for f in features:
        assert f.grad is not None and f.grad.abs().sum() > 0


def test_wrong_number_of_levels():
    head = Stage1Head(num_classes=2)
    with pytest.raises(ValueError, match="4 feature maps"):
        head(_features()[:3])
