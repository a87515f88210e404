import numpy as np
import pytest

from nnunetv2_meddisseg.evaluation.metrics import (
    EPSILON,
    binary_metrics,
    dice_hd95_transunet,
    hd95,
    mean_and_std,
    multiclass_dice_hd95,
    surface_voxels,
)


def brute_surface(mask: np.ndarray) -> np.ndarray:
    """Foreground voxels with at least one face neighbour outside the mask (outside the array counts)."""
    padded = np.pad(mask.astype(bool), 1)
    out = np.zeros(mask.shape, dtype=bool)
    for idx in np.argwhere(mask):
        p = idx + 1
        for axis in range(mask.ndim):
            for delta in (-1, 1):
                q = p.copy()
                q[axis] += delta
                if not padded[tuple(q)]:
                    out[tuple(idx)] = True
    return out


def brute_hd95(a, b, spacing):
    pa = np.argwhere(brute_surface(a)) * np.asarray(spacing, dtype=float)
    pb = np.argwhere(brute_surface(b)) * np.asarray(spacing, dtype=float)
    d = np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1))
    return max(np.percentile(d.min(1), 95), np.percentile(d.min(0), 95))


def test_binary_metrics_hand_computed():
    g = np.zeros((4, 4), dtype=np.uint8)
    g[0, :] = 1  # 4 pixels
    p = np.zeros((4, 4), dtype=np.uint8)
    p[0, :2] = 1
    p[1, :3] = 1  # 5 pixels, 2 of them correct
    m = binary_metrics(p, g)
    # I = 2, |P| = 5, |G| = 4, U = 7
    assert m["iou"] == pytest.approx(2 / 7)
    assert m["dice"] == pytest.approx(4 / 9)
    assert m["recall"] == pytest.approx(2 / 4)
    assert m["precision"] == pytest.approx(2 / 5)


def test_binary_metrics_empty_cases():
    z = np.zeros((5, 5), dtype=np.uint8)
    g = z.copy()
    g[2, 2] = 1
    assert binary_metrics(z, z) == {"iou": 1.0, "dice": 1.0, "recall": 1.0, "precision": 1.0}
    m = binary_metrics(z, g)  # missed lesion: released code gives precision e/e = 1
    assert m["iou"] == pytest.approx(0.0, abs=1e-12) and m["dice"] == pytest.approx(0.0, abs=1e-12)
    assert m["recall"] == pytest.approx(0.0, abs=1e-12) and m["precision"] == 1.0
    m = binary_metrics(g, z)  # false positive on an empty mask
    assert m["iou"] < 1e-12 and m["precision"] < 1e-12 and m["recall"] == 1.0
    assert EPSILON == 1e-15


def test_binary_metrics_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        binary_metrics(np.zeros((3, 3)), np.zeros((3, 4)))


def test_surface_voxels_matches_brute_force():
    rng = np.random.default_rng(1)
    for shape in [(7, 9), (4, 5, 6)]:
        m = rng.random(shape) < 0.5
        np.testing.assert_array_equal(surface_voxels(m), brute_surface(m))


def test_hd95_single_points_and_squares():
    a = np.zeros((10, 10), bool)
    b = np.zeros((10, 10), bool)
    a[1, 1] = True
    b[4, 5] = True
    assert hd95(a, b) == pytest.approx(5.0)
    assert hd95(a, b, spacing=(2.0, 1.0)) == pytest.approx(np.hypot(6.0, 4.0))
    assert hd95(a, a) == 0.0


@pytest.mark.parametrize("seed,shape,spacing", [
    (0, (12, 12), (1.0, 1.0)),
    (1, (9, 14), (0.5, 2.0)),
    (2, (6, 7, 8), (1.0, 1.0, 1.0)),
    (3, (5, 9, 7), (3.0, 0.7, 0.7)),
    (4, (16, 16), (1.0, 1.0)),
])
def test_hd95_matches_brute_force(seed, shape, spacing):
    rng = np.random.default_rng(seed)
    a = rng.random(shape) < 0.15
    b = rng.random(shape) < 0.15
    if seed == 4:  # compact objects touching the border, far apart: exercises the bounding-box crop
        a[:] = False
        b[:] = False
        a[0:4, 0:5] = True
        b[10:16, 9:16] = True
    assert hd95(a, b, spacing) == pytest.approx(brute_hd95(a, b, spacing), rel=1e-9)
    assert hd95(b, a, spacing) == pytest.approx(hd95(a, b, spacing), rel=1e-12)


def test_hd95_empty_mask_raises():
    with pytest.raises(ValueError, match="non-empty"):
        hd95(np.zeros((3, 3)), np.ones((3, 3)))


def test_transunet_rule_for_empty_masks():
    z = np.zeros((6, 6), np.uint8)
    g = z.copy()
    g[1:3, 1:3] = 1
    p = z.copy()
    p[1:3, 1:4] = 1
    assert dice_hd95_transunet(z, z) == (0.0, 0.0)   # organ absent, nothing predicted
    assert dice_hd95_transunet(z, g) == (0.0, 0.0)   # missed organ
    assert dice_hd95_transunet(p, z) == (1.0, 0.0)   # prediction where the reference has no organ
    d, h = dice_hd95_transunet(p, g)
    assert d == pytest.approx(2 * 4 / (6 + 4))       # plain Dice, no smoothing
    assert h == pytest.approx(brute_hd95(p.astype(bool), g.astype(bool), (1, 1)))


def test_multiclass_dice_hd95():
    ref = np.zeros((4, 8, 8), np.int64)
    ref[1:3, 1:4, 1:4] = 1
    ref[1:3, 5:7, 5:7] = 2
    pred = ref.copy()
    pred[pred == 2] = 0          # organ 2 missed
    pred[0, 0, 0] = 3            # organ 3 absent from the reference but predicted
    out = multiclass_dice_hd95(pred, ref, [1, 2, 3, 4], spacing=(2.0, 1.0, 1.0))
    assert out[1] == {"dice": 1.0, "hd95": 0.0}
    assert out[2] == {"dice": 0.0, "hd95": 0.0}
    assert out[3] == {"dice": 1.0, "hd95": 0.0}
    assert out[4] == {"dice": 0.0, "hd95": 0.0}


def test_mean_and_std():
    m, s = mean_and_std([1 / 3, 1.0, 0.0])
    assert m == pytest.approx(4 / 9)
    assert s == pytest.approx(np.sqrt(21) / 9)
    assert mean_and_std([0.7]) == (0.7, 0.0)
    assert all(np.isnan(v) for v in mean_and_std([]))
