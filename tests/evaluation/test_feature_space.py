"""nnUNetv2_meddisseg_features' embedding and drawing on small hand-made arrays (the command itself runs
in tests/e2e/test_ablate.py on a trained pair)."""
import numpy as np
import pytest

from nnunetv2_meddisseg.evaluation.feature_space import ModelFeatures, _centre_fit, draw_features, pca_2d, sample_pixels


def test_pca_matches_the_svd_of_the_centred_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 40)) * np.linspace(3, 0.1, 40)
    centred = x - x.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    reference = u[:, :2] * s[:2]
    got = pca_2d(x)
    for k in range(2):  # the sign of a principal direction is arbitrary
        assert np.allclose(got[:, k], reference[:, k]) or np.allclose(got[:, k], -reference[:, k])


def test_pca_of_a_collapsed_batch_is_a_point():
    assert np.allclose(pca_2d(np.ones((4, 10))), 0.0)


def test_pixels_are_sampled_half_foreground_half_background():
    features = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    foreground = np.zeros((2, 4, 4), dtype=bool)
    foreground[0, :2] = True  # 8 foreground pixels in image 0, none in image 1
    vectors, images, fg = sample_pixels(features, foreground, per_image=6)
    assert vectors.shape == (9, 3)  # image 0: 3 + 3; image 1: no foreground, 3 background
    assert list(images) == [0] * 6 + [1] * 3 and fg.tolist() == [True] * 3 + [False] * 6
    for v, i, f in zip(vectors, images, fg):  # each vector is the channel vector at one pixel of its image
        hits = np.argwhere((features[i] == v[:, None, None]).all(axis=0))
        assert len(hits) == 1 and foreground[i][tuple(hits[0])] == f


def test_centre_fit_crops_and_pads_to_multiples_of_16():
    x = np.arange(20 * 40, dtype=np.float32).reshape(1, 20, 40)
    out = _centre_fit(x, (24, 32))
    assert out.shape == (1, 32, 32)
    assert np.array_equal(out[0, 6:26], x[0, :, 4:36]) and not out[0, :6].any() and not out[0, 26:].any()


@pytest.mark.parametrize("tsne", [False, True])
def test_draw_writes_a_png(tmp_path, tsne):
    if tsne:
        pytest.importorskip("sklearn")
    rng = np.random.default_rng(0)
    models = [ModelFeatures(name, rng.normal(size=(5, 4, 8, 8)).astype(np.float32), rng.random((5, 8, 8)) > 0.5,
                            [f"c{i}" for i in range(5)]) for name in ("A", "B")]
    out = tmp_path / "f.png"
    draw_features(models, "early", str(out), pixels_per_image=8, tsne=tsne)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
