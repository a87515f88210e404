"""``nnUNetv2_meddisseg_features``: pictures of the feature space at the dispersion-regularised layer.

Each trained model (checkpoint read weights-only) runs on the raw dataset's ``imagesTs``, preprocessed as nnU-Net
does and centre-cropped or zero-padded to the plans' patch size; its features (``MedDisSegOutput.features``, eval
mode) are read at ``--layer``: 'early' = ELAT-refined x2, 'middle' = x4, 'late' = output of D_s. Each model's row
shows 2-D PCA and t-SNE (scikit-learn, optional) of its per-image features (each feature map flattened, as the
dispersive loss sees a batch; one colour per image) and of pixel features (the channel vector at sampled
positions, coloured foreground / background by ``labelsTs``, else by the model's own prediction). The row title
holds the per-image dispersion diagnostics (mean pairwise distance ``||h_i - h_j||^2 / D``, effective rank).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from nnunetv2_meddisseg.cli import (
    DefaultsHelpFormatter,
    add_device_argument,
    plain_text,
    resolve_device,
    run_command,
)
from nnunetv2_meddisseg.errors import UserError

__all__ = ["LAYERS", "pca_2d", "tsne_2d", "sample_pixels", "ModelFeatures", "model_features", "draw_features",
           "main"]

PROG = "nnUNetv2_meddisseg_features"
LAYERS = ("early", "middle", "late")
FOREGROUND_COLOUR, BACKGROUND_COLOUR = (0.85, 0.15, 0.1, 1.0), (0.2, 0.4, 0.85, 1.0)
TSNE_MISSING = "scikit-learn is not installed: t-SNE panels are left out (pip install scikit-learn adds them)"


def pca_2d(x: np.ndarray) -> np.ndarray:
    """(N, D) -> (N, 2) PCA of the rows via the N x N Gram matrix (so D may be large); zeros where the rank is lower."""
    centred = x.astype(np.float64) - x.mean(axis=0, keepdims=True)
    gram = centred @ centred.T
    eigenvalues, eigenvectors = np.linalg.eigh(gram)
    order = np.argsort(eigenvalues)[::-1][:2]
    scores = eigenvectors[:, order] * np.sqrt(np.clip(eigenvalues[order], 0, None))
    out = np.zeros((x.shape[0], 2))
    out[:, :scores.shape[1]] = scores
    return out


def tsne_2d(x: np.ndarray, seed: int = 0) -> Optional[np.ndarray]:
    """(N, D) -> (N, 2) t-SNE of the rows (after PCA to at most 50 dimensions), or None without scikit-learn."""
    try:
        from sklearn.decomposition import PCA
        from sklearn.manifold import TSNE
    except ImportError:
        return None
    n = x.shape[0]
    if n < 3:
        return pca_2d(x)
    reduced = PCA(n_components=min(50, n - 1, x.shape[1]), random_state=seed).fit_transform(x.astype(np.float64))
    return TSNE(n_components=2, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed).fit_transform(reduced)


def sample_pixels(features: np.ndarray, foreground: np.ndarray, per_image: int, seed: int = 0
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixel feature vectors, half foreground and half background where both exist: features (N, C, h, w),
    foreground (N, h, w) bool -> (vectors (M, C), image index (M,), is foreground (M,))."""
    rng = np.random.default_rng(seed)
    vectors, images, fg = [], [], []
    for i in range(features.shape[0]):
        for value, share in ((True, per_image // 2), (False, per_image - per_image // 2)):
            ys, xs = np.nonzero(foreground[i] == value)
            take = rng.choice(len(ys), size=min(share, len(ys)), replace=False) if len(ys) else []
            vectors.append(features[i][:, ys[take], xs[take]].T)
            images += [i] * len(take)
            fg += [value] * len(take)
    return np.concatenate(vectors, axis=0), np.array(images), np.array(fg, dtype=bool)


class ModelFeatures:
    """Features of one model on the test images at one layer."""

    def __init__(self, name: str, features: np.ndarray, foreground: np.ndarray, cases: Sequence[str]):
        self.name = name
        self.features = features  #: (N, C, h, w)
        self.foreground = foreground  #: (N, h, w) bool, at the layer's resolution
        self.cases = list(cases)

    def diagnostics(self) -> Dict[str, float]:
        import torch

        from nnunetv2_meddisseg.losses import dispersion_diagnostics

        return dispersion_diagnostics(torch.from_numpy(self.features))


def _load_network(model_dir: Path, fold: str, checkpoint: str, device):
    """(nnUNetPredictor, MedDisSegNet in eval mode returning its features)."""
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    from nnunetv2_meddisseg.architectures import MedDisSegNet
    from nnunetv2_meddisseg.module_wrappers import unwrap_module
    from nnunetv2_meddisseg.torch_files import initialize_predictor

    if not (model_dir / f"fold_{fold}" / checkpoint).is_file():
        raise UserError(f"no trained model: {model_dir / f'fold_{fold}' / checkpoint} does not exist")
    predictor = nnUNetPredictor(device=device, perform_everything_on_device=False, verbose=False, allow_tqdm=False)
    with contextlib.redirect_stdout(io.StringIO()):
        initialize_predictor(predictor, model_dir, [fold], checkpoint)
    network = unwrap_module(predictor.network)
    if not isinstance(network, MedDisSegNet):
        raise UserError(f"{model_dir.name}: the network is {type(network).__name__}, not MedDisSegNet; features are "
                        f"read from Med-DisSeg networks only")
    network.load_state_dict(predictor.list_of_parameters[0])
    network.to(device).eval()
    return predictor, network


def _centre_fit(x: np.ndarray, size: Sequence[int], value: float = 0.0) -> np.ndarray:
    """Centre-crop or pad the last two axes of ``x`` to ``size`` rounded up to a multiple of 16."""
    out_size = [int(np.ceil(s / 16) * 16) for s in size]
    out = np.full(x.shape[:-2] + tuple(out_size), value, dtype=x.dtype)
    src, dst = [], []
    for have, want in zip(x.shape[-2:], out_size):
        offset = abs(have - want) // 2
        src.append(slice(offset, offset + want) if have > want else slice(0, have))
        dst.append(slice(0, want) if have > want else slice(offset, offset + have))
    out[(..., *dst)] = x[(..., *src)]
    return out


def _test_cases(dataset_name: str, file_ending: str, max_images: int) -> List[Tuple[str, List[str], Optional[str]]]:
    """[(case, image files, label file or None)] of imagesTs / labelsTs, sorted, at most ``max_images``."""
    from nnunetv2.paths import nnUNet_raw
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    raw = Path(nnUNet_raw.require()) / dataset_name
    if not (raw / "imagesTs").is_dir():
        raise UserError(f"{raw / 'imagesTs'} not found: the features are read on the raw dataset's test images")
    lists = create_lists_from_splitted_dataset_folder(str(raw / "imagesTs"), file_ending)[:max_images]
    if len(lists) < 2:
        raise UserError(f"{raw / 'imagesTs'} holds {len(lists)} image(s) ending in _0000{file_ending}; at least 2 "
                        f"are needed to compare images")
    cases = []
    for files in lists:
        case = os.path.basename(files[0])[:-(len(file_ending) + 5)]
        label = raw / "labelsTs" / f"{case}{file_ending}"
        cases.append((case, files, str(label) if label.is_file() else None))
    return cases


def model_features(name: str, model_dir: Path, fold: str, checkpoint: str, layer: str, max_images: int,
                   device) -> ModelFeatures:
    """Run one trained model on the test images; the middle slice of 3D images."""
    import torch
    import torch.nn.functional as F

    predictor, network = _load_network(model_dir, fold, checkpoint, device)
    preprocessor = predictor.configuration_manager.preprocessor_class(verbose=False)
    patch = predictor.configuration_manager.patch_size
    cases = _test_cases(model_dir.parent.name, predictor.dataset_json["file_ending"], max_images)
    features, foreground = [], []
    for case, files, label in cases:
        with contextlib.redirect_stdout(io.StringIO()):
            data, seg, _ = preprocessor.run_case(files, label, predictor.plans_manager,
                                                 predictor.configuration_manager, predictor.dataset_json)
        z = data.shape[1] // 2
        image = torch.from_numpy(_centre_fit(data[:, z], patch)[None]).float().to(device)
        with torch.no_grad():
            output = network(image, output="all")
        if seg is not None:
            mask = torch.from_numpy(_centre_fit(seg[0, z], patch, value=0) > 0)
        else:
            mask = (output.logits.argmax(1)[0] > 0).cpu()
        layer_features = output.features[layer][0].float().cpu()
        mask = F.interpolate(mask[None, None].float(), size=layer_features.shape[-2:], mode="nearest")[0, 0] > 0
        features.append(layer_features.numpy())
        foreground.append(mask.numpy())
    return ModelFeatures(name, np.stack(features), np.stack(foreground), [c for c, _, _ in cases])


def _scatter(ax, points: np.ndarray, colours, title: str, legend: Optional[Sequence[Tuple[str, str]]] = None) -> None:
    ax.scatter(points[:, 0], points[:, 1], c=colours, s=14, linewidths=0, alpha=0.8)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    if legend:
        for label, colour in legend:
            ax.scatter([], [], color=colour, s=14, label=label)
        ax.legend(fontsize=7, loc="best", frameon=False)


def draw_features(models: Sequence[ModelFeatures], layer: str, out_file: str, pixels_per_image: int = 64,
                  tsne: bool = True) -> None:
    """One row per model: per-image PCA (and t-SNE), pixel PCA (and t-SNE) coloured foreground / background."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [("PCA", pca_2d)] + ([("t-SNE", tsne_2d)] if tsne else [])
    fig = plt.figure(figsize=(3.2 * 2 * len(methods), 3.6 * len(models)), layout="constrained")
    for subfig, model in zip(np.atleast_1d(fig.subfigures(len(models), 1)), models):
        row = subfig.subplots(1, 2 * len(methods))
        n = model.features.shape[0]
        image_colours = plt.get_cmap("tab20")(np.arange(n) % 20)
        vectors, images, fg = sample_pixels(model.features, model.foreground, pixels_per_image)
        pixel_colours = np.where(fg[:, None], np.array([FOREGROUND_COLOUR]), np.array([BACKGROUND_COLOUR]))
        flat = model.features.reshape(n, -1)
        for k, (method, embed) in enumerate(methods):
            _scatter(row[k], embed(flat), image_colours, f"per-image features, {method} ({n} images)")
            _scatter(row[len(methods) + k], embed(vectors), pixel_colours,
                     f"pixel features, {method} ({len(vectors)} pixels)",
                     legend=[("foreground", FOREGROUND_COLOUR), ("background", BACKGROUND_COLOUR)])
        d = model.diagnostics()
        subfig.suptitle(f"{model.name}: layer '{layer}', C = {model.features.shape[1]}; mean pairwise distance "
                        f"{d['mean_pairwise_distance']:.3g}, effective rank {d['effective_rank']:.2f} of {n - 1}",
                        fontsize=10, fontweight="bold")
    fig.savefig(out_file, dpi=80)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=plain_text(__doc__.split("\n\n")[0]),
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("-d", "--dataset", required=True, help="dataset ID or name")
    p.add_argument("-tr", "--trainer", action="append", required=True,
                   help="trainer of a trained model; give -tr twice to compare two models side by side")
    p.add_argument("-p", "--plans", default="nnUNetPlans", help="plans of the trained models")
    p.add_argument("-c", "--configuration", default="2d", help="configuration of the trained models")
    p.add_argument("-f", "--fold", default="0", help="fold of the trained models")
    p.add_argument("--checkpoint", default="checkpoint_final.pth", help="checkpoint file of the trained models")
    p.add_argument("--layer", choices=LAYERS, default="early",
                   help="which features: early (the paper's regularised layer), middle or late")
    p.add_argument("-o", "--output", default=None, help="PNG file (default: ./meddisseg_features_<layer>.png)")
    p.add_argument("--max_images", type=int, default=32, help="test images to use, in name order")
    p.add_argument("--pixels_per_image", type=int, default=64, help="pixel features sampled per image")
    add_device_argument(p, ("cpu", "cuda", "mps"), "device to run the models on")
    p.add_argument("--no_tsne", action="store_true", help="PCA panels only")
    return p


def _features(argv: Optional[Sequence[str]]) -> None:
    import torch
    from nnunetv2.paths import nnUNet_results
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    args = _parser().parse_args(argv)
    if len(args.trainer) > 2:
        raise UserError(f"-tr: at most two trainers, got {len(args.trainer)}")
    if args.max_images < 2 or args.pixels_per_image < 2:
        raise UserError("--max_images and --pixels_per_image must be at least 2")
    try:
        dataset = maybe_convert_to_dataset_name(args.dataset)
    except RuntimeError as e:
        raise UserError(f"-d {args.dataset}: {e}") from None
    device = torch.device(resolve_device(args.device))
    tsne = not args.no_tsne
    if tsne and importlib.util.find_spec("sklearn") is None:
        print(f"{PROG}: {TSNE_MISSING}", file=sys.stderr)
        tsne = False
    results = Path(nnUNet_results.require()) / dataset
    models = [model_features(trainer, results / f"{trainer}__{args.plans}__{args.configuration}", args.fold,
                             args.checkpoint, args.layer, args.max_images, device) for trainer in args.trainer]
    out = args.output or f"meddisseg_features_{args.layer}.png"
    draw_features(models, args.layer, out, args.pixels_per_image, tsne)
    for model in models:
        d = model.diagnostics()
        print(f"{model.name}: mean pairwise distance {d['mean_pairwise_distance']:.4g}, effective rank "
              f"{d['effective_rank']:.3f} ({len(model.cases)} test images, layer '{args.layer}')")
    print(f"wrote {out}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _features, argv)


if __name__ == "__main__":
    sys.exit(main())
