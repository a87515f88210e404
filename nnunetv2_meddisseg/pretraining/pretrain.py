"""``nnUNetv2_meddisseg_pretrain``: self-supervised pretraining on a dataset's own preprocessed training images.

benchmarks/RESULTS.md ("Choosing the pretraining method") measures which ``--method`` serves the fine-tuning best.

Data: the fold's preprocessed training cases (``splits_final.json``, else nnU-Net's default split), not their pickles;
its validation cases only with ``--use_validation_cases``; optionally ``--unlabelled_folder``'s raw images, preprocessed
in memory. Nothing in ``nnUNet_raw`` is read, ``imagesTs`` never.

``-o`` gets ``{"network_weights": ..., "pretraining": {...}}`` (plain tensors, JSON-like values). ``nnUNetPlans``:
nnU-Net's whole network with one output per input channel, for ``-pretrained_weights`` (every key but the reconstruction
head's ``.seg_layers.`` fits the segmentation network). ``nnUNetMedDisSegPlans``: the ResNet-50 encoder (stem,
layer1..layer3) as ``encoder.*`` for ``nnUNetv2_meddisseg_plan --encoder_weights``, trained through a light head
(``contrastive``: a projection head) that is not kept; ELAT and the rest of Med-DisSeg are not pretrained.

Training is nnU-Net's (``pretrain``; fp16 autocast on CUDA, fp32 on the CPU), seeded by ``--seed``. Each epoch writes
``<FILE>.checkpoint`` atomically; a rerun with equal settings resumes from it to an uninterrupted run's weights. Only
``-o`` and its checkpoint are written; ``-o`` is refused inside ``nnUNet_raw``, ``nnUNet_preprocessed`` or the
unlabelled folder, or existing without this run's checkpoint.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm import tqdm

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, add_device_argument, resolve_device, run_command
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import is_inside, write_atomically
from nnunetv2_meddisseg.pretraining.contrastive import ContrastiveNet, nt_xent
from nnunetv2_meddisseg.pretraining.masking import mask_patches, masked_loss
from nnunetv2_meddisseg.pretraining.restoration import EncoderRestorationNet, corrupt
from nnunetv2_meddisseg.torch_files import read_checkpoint

__all__ = ["METHODS", "CHECKPOINT_SUFFIX", "PretrainSettings", "checkpoint_path", "read_preprocessed_case",
           "fold_cases", "build_pretraining_model", "pretrained_weights", "BatchSampler", "pretrain",
           "run_pretraining", "main"]

PROG = "nnUNetv2_meddisseg_pretrain"
#: ``--method`` -> the ``pretraining.method`` of the files written
METHODS = {"restoration": "models_genesis_restoration", "masked": "masked_image_modelling", "contrastive": "simclr"}
#: the checkpoint beside ``-o``: ``<FILE>.checkpoint``
CHECKPOINT_SUFFIX = ".checkpoint"
#: nnU-Net's default five-fold split (``nnUNetTrainer.do_split``)
NNUNET_SPLIT_SEED, NNUNET_FOLDS = 12345, 5
#: the endings of nnU-Net's preprocessed case files
CASE_ENDINGS = (".b2nd", ".npy", ".npz")


@dataclass
class PretrainSettings:
    """What a pretraining run does; a checkpoint resumes only a run of equal settings."""
    epochs: int = 100
    iterations_per_epoch: int = 250
    seed: int = 0
    method: str = "masked"
    batch_size: int = 2
    patch_size: Tuple[int, int] = (64, 64)
    initial_lr: float = 1e-2
    weight_decay: float = 3e-5
    #: what the run reads and builds (dataset, plans, fold, cases, network), compared on resumption too
    identity: Dict[str, object] = field(default_factory=dict)


def checkpoint_path(output: Path) -> Path:
    """The checkpoint beside ``output``."""
    return Path(str(output) + CHECKPOINT_SUFFIX)


def read_preprocessed_case(folder: Path, identifier: str) -> np.ndarray:
    """A preprocessed 2D case's image, (C, X, Y) float32, from ``.b2nd``, ``.npy`` or ``.npz`` (never its pickle)."""
    folder = Path(folder)
    file = next((folder / f"{identifier}{e}" for e in CASE_ENDINGS if (folder / f"{identifier}{e}").is_file()), None)
    if file is None:
        raise UserError(f"{folder}: no preprocessed case {identifier} (.b2nd, .npy or .npz): run nnUNetv2_preprocess "
                        f"for this configuration")
    try:
        if file.suffix == ".b2nd":
            import blosc2

            data = np.asarray(blosc2.open(urlpath=str(file), mode="r")[:])
        elif file.suffix == ".npy":
            data = np.load(file, allow_pickle=False)
        else:
            with np.load(file, allow_pickle=False) as archive:
                data = archive["data"]
    except Exception as e:  # noqa: BLE001 (blosc2 and NumPy report a damaged file in several types)
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"{file}: cannot be read as a preprocessed case (truncated or damaged? {reason}): run "
                        f"nnUNetv2_preprocess for this configuration again") from None
    if not (data.ndim == 4 and data.shape[1] == 1 and np.issubdtype(data.dtype, np.number)):
        raise UserError(f"{file}: holds an array of shape {data.shape}, expected a 2D preprocessed case "
                        f"(channels, 1, height, width)")
    return np.ascontiguousarray(data[:, 0], dtype=np.float32)


def fold_cases(preprocessed_folder: Path, fold: str, use_validation: bool = False) -> Tuple[List[str], str]:
    """``(cases, split source)`` of the fold: ``splits_final.json`` beside the folder, else nnU-Net's default split."""
    folder = Path(preprocessed_folder)
    available = sorted({path.name[:-len(e)] for path in folder.iterdir() for e in CASE_ENDINGS
                        if path.name.endswith(e) and not path.name.endswith(f"_seg{e}")})
    if not available:
        raise UserError(f"{folder}: no preprocessed cases: run nnUNetv2_plan_and_preprocess for this configuration")
    if fold == "all":
        return available, "fold all: every preprocessed case"
    if not fold.isdigit():
        raise UserError(f"-f {fold}: expected a fold number or 'all'")
    splits_file = folder.parent / "splits_final.json"
    if splits_file.is_file():
        try:
            splits = json.loads(splits_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UserError(f"{splits_file}: cannot be read as nnU-Net's list of splits ({e})") from None
        source = str(splits_file)
        valid = isinstance(splits, list) and all(
            isinstance(s, dict) and all(isinstance(s.get(k), list) and all(isinstance(n, str) for n in s[k])
                                        for k in ("train", "val")) for s in splits)
        if not valid:
            raise UserError(f"{splits_file}: expected nnU-Net's list of splits, one object per fold with lists of "
                            f"case names 'train' and 'val'")
    else:
        from nnunetv2.utilities.crossval_split import generate_crossval_split

        splits = generate_crossval_split(available, seed=NNUNET_SPLIT_SEED, n_splits=NNUNET_FOLDS)
        source = f"nnU-Net's default split (no {splits_file} yet; nnUNetv2_train writes the same)"
    if int(fold) >= len(splits):
        raise UserError(f"-f {fold}: {source} has {len(splits)} folds (0 to {len(splits) - 1})")
    split = splits[int(fold)]
    cases = [str(c) for c in split["train"] + (split["val"] if use_validation else [])]
    missing = [c for c in cases if c not in available]
    if missing:
        raise UserError(f"{folder}: no preprocessed case {missing[0]} of fold {fold} ({source}): run "
                        f"nnUNetv2_preprocess for this configuration")
    if not cases:
        raise UserError(f"-f {fold}: the fold has no training cases ({source})")
    return cases, source


def build_pretraining_model(configuration_manager, channels: int, method: str = "restoration"):
    """``(model, kind)``: Med-DisSeg's encoder in an ``EncoderRestorationNet`` (``meddisseg_encoder``), else the plans'
    network with ``channels`` outputs (``nnunet_network``); ``contrastive``: the encoder in a ``ContrastiveNet``."""
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    from nnunetv2_meddisseg.training.network_from_plans import build_meddisseg_network, network_class_is_meddisseg

    cm = configuration_manager
    if network_class_is_meddisseg(cm):
        encoder = build_meddisseg_network(cm, channels, 2, enable_deep_supervision=False).encoder
        model = ContrastiveNet(encoder) if method == "contrastive" else EncoderRestorationNet(encoder, channels)
        return model, "meddisseg_encoder"
    network = get_network_from_plans(cm.network_arch_class_name, cm.network_arch_init_kwargs,
                                     cm.network_arch_init_kwargs_req_import, channels, channels, allow_init=True,
                                     deep_supervision=False)
    return (ContrastiveNet(network.encoder, network) if method == "contrastive" else network), "nnunet_network"


def pretrained_weights(model, kind: str) -> dict:
    """What ``-o`` holds as ``network_weights`` (module docstring), on the CPU."""
    whole = model if getattr(model, "network", None) is None else model.network  # a ContrastiveNet: beside its head
    state = model.encoder.state_dict(prefix="encoder.") if kind == "meddisseg_encoder" else whole.state_dict()
    return {k: v.detach().cpu().clone() for k, v in state.items()}


class BatchSampler:
    """Random crops of random ``images`` (callables returning (C, X, Y) float32) at nnU-Net's initial patch size
    (zero-padded), augmented to ``patch_size``; drawn from NumPy's and torch's global generators, as nnU-Net does."""

    def __init__(self, images: Sequence[Callable[[], np.ndarray]], patch_size: Sequence[int], batch_size: int):
        from nnunetv2.training.data_augmentation.compute_initial_patch_size import get_patch_size
        from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer

        self.images, self.patch_size, self.batch_size = list(images), tuple(int(p) for p in patch_size), batch_size
        degrees = 15. if max(self.patch_size) / min(self.patch_size) > 1.5 else 180.
        rotation = (-degrees / 360 * 2. * np.pi, degrees / 360 * 2. * np.pi)
        self.initial = tuple(int(s) for s in get_patch_size(self.patch_size, rotation, rotation, rotation,
                                                             (0.85, 1.25)))
        self.transforms = nnUNetTrainer.get_training_transforms(self.patch_size, rotation, None, (0, 1), False)

    def _view(self, image: np.ndarray):
        pad = [(0, 0)] + [((max(0, p - s) + 1) // 2, max(0, p - s) // 2)
                          for s, p in zip(image.shape[1:], self.initial)]
        image = np.pad(image, pad)
        x, y = (np.random.randint(0, s - p + 1) for s, p in zip(image.shape[1:], self.initial))
        crop = torch.from_numpy(np.ascontiguousarray(image[:, x:x + self.initial[0], y:y + self.initial[1]]))
        seg = torch.zeros((1, *crop.shape[1:]), dtype=torch.int16)
        return self.transforms(image=crop, segmentation=seg)["image"].float()

    def __call__(self):
        return torch.stack([self._view(self.images[np.random.randint(len(self.images))]())
                            for _ in range(self.batch_size)])

    def pairs(self):
        """(2 x batch_size, C, X, Y): rows i and i + batch_size are two views (crop, augmentation) of one image."""
        images = [self.images[np.random.randint(len(self.images))]() for _ in range(self.batch_size)]
        return torch.stack([self._view(image) for image in images * 2])


def _rng_states() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
              "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate((3, tuple(states["python"]), None))
    n = states["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (before the network is built)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _read_checkpoint(path: Path, settings: PretrainSettings) -> dict:
    checkpoint = read_checkpoint(path)
    recorded = checkpoint.get("settings")
    current = json.loads(json.dumps(asdict(settings)))
    if not isinstance(recorded, dict) or "epoch" not in checkpoint:
        raise UserError(f"{path} is not a checkpoint of {PROG}: remove it or choose another -o")
    for key in current:
        if recorded.get(key) != current[key]:
            what = key if key != "identity" else next(
                (k for k in current["identity"] if recorded.get("identity", {}).get(k) != current["identity"][k]),
                "identity")
            raise UserError(f"{path} is the checkpoint of a run with other settings ({what} differs): run with the "
                            f"same settings to resume it, or remove it to start again")
    return checkpoint


def step_loss(method: str, model, batch, generator, device):
    """The loss of one batch by ``method``: restoring its corruption or hidden patches, or NT-Xent of its views (the
    pairs of ``BatchSampler.pairs``). Corruptions and masks are drawn on the CPU from ``generator``."""
    autocast = torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda")
    target = batch.to(device, non_blocking=True)
    if method == "contrastive":
        with autocast:
            projections = model(target)
        return nt_xent(projections)
    if method == "masked":
        inputs, mask = mask_patches(target, generator)
    else:
        inputs = corrupt(batch, generator).to(device, non_blocking=True)
    with autocast:
        restored = model(inputs)
    if method == "masked":
        return masked_loss(restored, target, mask)
    return torch.nn.functional.mse_loss(restored.float(), target)


def pretrain(model, next_batch: Callable[[], torch.Tensor], settings: PretrainSettings, device: str,
             checkpoint: Path, progress: bool = True,
             log: Optional[Callable[[str], None]] = None) -> Tuple[List[float], float]:
    """Train ``model``, writing ``checkpoint`` after each epoch and resuming from it where it exists; returns each
    epoch's mean loss and the seconds over all resumptions. ``log``: default ``tqdm.write`` (keeps the bar intact)."""
    log = log or tqdm.write
    device_t = torch.device(device)
    model.to(device_t)
    optimizer = torch.optim.SGD(model.parameters(), settings.initial_lr, momentum=0.99, nesterov=True,
                                weight_decay=settings.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=device_t.type == "cuda")
    generator = torch.Generator().manual_seed(settings.seed)
    losses: List[float] = []
    seconds = 0.0
    start = 0
    if checkpoint.is_file():
        saved = _read_checkpoint(checkpoint, settings)
        model.load_state_dict(saved["network"])
        optimizer.load_state_dict(saved["optimizer"])
        if saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        generator.set_state(saved["generator"])
        _set_rng_states(saved["rng"])
        losses, seconds, start = list(saved["losses"]), float(saved["seconds"]), int(saved["epoch"])
        log(f"resuming from {checkpoint} after epoch {start}")
    for epoch in range(start, settings.epochs):
        began = time.monotonic()
        lr = settings.initial_lr * (1 - epoch / settings.epochs) ** 0.9
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()
        total = 0.0
        bar = tqdm(range(settings.iterations_per_epoch), desc=f"epoch {epoch + 1}/{settings.epochs}",
                   disable=not progress, leave=False)
        for _ in bar:
            batch = next_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(settings.method, model, batch, generator, device_t)
            scaler.scale(loss).backward()  # a disabled scaler (CPU) neither scales nor unscales
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 12)
            scaler.step(optimizer)
            scaler.update()
            value = float(loss.detach())
            total += value
            bar.set_postfix(loss=f"{value:.4f}")
        losses.append(total / settings.iterations_per_epoch)
        seconds += time.monotonic() - began
        state = {"settings": json.loads(json.dumps(asdict(settings))), "epoch": epoch + 1, "losses": losses,
                 "seconds": seconds, "network": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "generator": generator.get_state(), "rng": _rng_states()}
        write_atomically(checkpoint, lambda tmp: torch.save(state, tmp))
        log(f"epoch {epoch + 1}/{settings.epochs}: {settings.method} loss {losses[-1]:.4f}, lr {lr:.2e}, "
            f"{time.monotonic() - began:.1f} s")
    return losses, seconds


def _unlabelled_images(folder: Path, plans_manager, configuration_manager, dataset_json: dict) -> List[np.ndarray]:
    """The raw images of ``folder``, preprocessed as nnU-Net preprocesses the dataset, (C, X, Y) float32 each."""
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    ending = dataset_json["file_ending"]
    channels = len(dataset_json["channel_names"])
    cases = create_lists_from_splitted_dataset_folder(str(folder), ending, num_processes=1)
    if not cases:
        raise UserError(f"--unlabelled_folder {folder}: no images <case>_0000{ending} (the dataset's format)")
    preprocessor = configuration_manager.preprocessor_class(verbose=False)
    images = []
    for files in cases:
        try:
            data, _, _ = preprocessor.run_case(files, None, plans_manager, configuration_manager, dataset_json)
        except Exception as e:  # noqa: BLE001 (the readers report unreadable images in many types)
            raise UserError(f"--unlabelled_folder: {files[0]} cannot be read and preprocessed as the dataset's "
                            f"images ({' '.join(str(e).split())[:200] or type(e).__name__})") from None
        if data.ndim != 4 or data.shape[1] != 1 or data.shape[0] != channels:
            raise UserError(f"--unlabelled_folder: {files[0]} is not a 2D image of the dataset's {channels} channel(s) "
                            f"(preprocessed shape {data.shape}, expected ({channels}, 1, X, Y))")
        images.append(np.ascontiguousarray(data[:, 0], dtype=np.float32))
    return images


def _check_output(output: Path, forbidden: Dict[str, Path]) -> Path:
    output = Path(os.path.abspath(output))
    for what, folder in forbidden.items():
        if folder is not None and (output == Path(os.path.abspath(folder)) or is_inside(output, folder)):
            raise UserError(f"-o {output} is inside {what} ({folder}): this command never writes into its inputs; "
                            f"choose a file elsewhere")
    if output.is_dir():
        raise UserError(f"-o {output} is a folder, expected the weights file to write")
    if output.exists() and not checkpoint_path(output).is_file():
        raise UserError(f"-o {output} exists: remove it or choose another file (a run resumes only from its "
                        f"checkpoint {checkpoint_path(output).name} beside it)")
    if not output.parent.is_dir():
        raise UserError(f"-o {output}: its folder {output.parent} does not exist")
    return output


def run_pretraining(dataset: str, configuration: str, plans_name: str, fold: str, output: Path, epochs: int = 100,
                    iterations_per_epoch: int = 250, seed: int = 0, method: str = "masked",
                    device: Optional[str] = None,
                    unlabelled_folder: Optional[Path] = None, use_validation_cases: bool = False,
                    progress: bool = True) -> dict:
    """Pretrain (module docstring) and write ``output``; returns its ``pretraining`` record."""
    if method not in METHODS:
        raise UserError(f"--method {method}: expected one of {', '.join(METHODS)}")
    if epochs < 1 or iterations_per_epoch < 1:
        raise UserError(f"--epochs and --iterations_per_epoch must be at least 1, got {epochs} and "
                        f"{iterations_per_epoch}")
    preprocessed = os.environ.get("nnUNet_preprocessed")
    if not preprocessed:
        raise UserError("the environment variable nnUNet_preprocessed is not set (see the README's "
                        "'nnU-Net environment variables')")
    raw = os.environ.get("nnUNet_raw")
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    try:
        dataset_name = str(maybe_convert_to_dataset_name(dataset))
    except (RuntimeError, ValueError):
        raise UserError(f"-d {dataset}: no such dataset in nnUNet_preprocessed ({preprocessed}) or nnUNet_raw "
                        f"({raw or 'not set'}); run nnUNetv2_plan_and_preprocess -d {dataset} -c 2d first") from None
    folder = Path(preprocessed) / dataset_name
    plans_file = folder / f"{plans_name}.json"
    if not plans_file.is_file():
        raise UserError(f"-p {plans_name}: {plans_file} not found (nnUNetv2_plan_and_preprocess writes nnUNetPlans, "
                        f"nnUNetv2_meddisseg_plan nnUNetMedDisSegPlans)")
    try:
        plans = json.loads(plans_file.read_text(encoding="utf-8"))
        dataset_json = json.loads((folder / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{folder}: its plans or dataset.json cannot be read ({e})") from None
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    if configuration not in plans.get("configurations", {}):
        raise UserError(f"-c {configuration}: not a configuration of {plans_file} (it has "
                        f"{', '.join(plans.get('configurations', {})) or 'none'})")
    plans_manager = PlansManager(plans)
    cm = plans_manager.get_configuration(configuration)
    if len(cm.patch_size) != 2:
        raise UserError(f"-c {configuration}: a {len(cm.patch_size)}D configuration; pretraining is 2D only "
                        f"(use -c 2d)")
    if unlabelled_folder is not None:
        unlabelled_folder = Path(os.path.abspath(unlabelled_folder))
        if not unlabelled_folder.is_dir():
            raise UserError(f"--unlabelled_folder {unlabelled_folder}: not a folder")
        if raw:
            for name in ("imagesTs", "labelsTs"):
                test = Path(raw) / dataset_name / name
                if unlabelled_folder == Path(os.path.abspath(test)) or is_inside(unlabelled_folder, test) \
                        or is_inside(test, unlabelled_folder):
                    raise UserError(f"--unlabelled_folder {unlabelled_folder}: holds or is the dataset's test "
                                    f"images ({test}); pretraining never reads them")
    output = _check_output(output, {"nnUNet_raw": Path(raw) if raw else None, "nnUNet_preprocessed": Path(preprocessed),
                                    "--unlabelled_folder": unlabelled_folder})
    data_folder = folder / cm.data_identifier
    if not data_folder.is_dir():
        raise UserError(f"{data_folder} not found: the {configuration} data is not preprocessed; run "
                        f"nnUNetv2_plan_and_preprocess -d {dataset} -c {configuration}")
    cases, split_source = fold_cases(data_folder, str(fold), use_validation_cases)
    device = resolve_device(device)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is available here (torch.cuda.is_available() is False)")
    channels = len(dataset_json.get("channel_names", dataset_json.get("modality", {})))
    unlabelled = (_unlabelled_images(unlabelled_folder, plans_manager, cm, dataset_json)
                  if unlabelled_folder is not None else [])
    images = [lambda c=c: read_preprocessed_case(data_folder, c) for c in cases]
    images += [lambda a=a: a for a in unlabelled]

    identity = {"method": METHODS[method], "dataset": dataset_name, "plans": plans_name, "configuration": configuration,
                "fold": str(fold), "cases": sorted(cases), "unlabelled_cases": len(unlabelled),
                "validation_cases_used": bool(use_validation_cases), "network_class": cm.network_arch_class_name,
                "iterations_per_epoch": iterations_per_epoch}
    settings = PretrainSettings(epochs=epochs, iterations_per_epoch=iterations_per_epoch, seed=seed, method=method,
                                batch_size=int(cm.batch_size), patch_size=tuple(int(p) for p in cm.patch_size),
                                identity=identity)
    seed_everything(seed)
    model, kind = build_pretraining_model(cm, channels, method)
    sampler = BatchSampler(images, settings.patch_size, settings.batch_size)
    print(f"pretraining ({method}) {kind} of {plans_name} ({cm.network_arch_class_name}) on {len(cases)} cases of "
          f"{dataset_name} fold {fold} ({split_source})" + (f" and {len(unlabelled)} unlabelled images"
                                                             if unlabelled else "") + f", on {device}")
    checkpoint = checkpoint_path(output)
    losses, seconds = pretrain(model, sampler.pairs if method == "contrastive" else sampler, settings, device,
                               checkpoint, progress=progress)
    record = {**identity, "network": kind, "cases": len(cases), "epochs": epochs, "seed": seed,
              "batch_size": settings.batch_size, "patch_size": list(settings.patch_size), "losses": losses,
              "minutes": seconds / 60, "split": split_source}
    weights = {"network_weights": pretrained_weights(model, kind), "pretraining": record}
    write_atomically(output, lambda tmp: torch.save(weights, tmp))
    checkpoint.unlink(missing_ok=True)
    use = (f"nnUNetv2_meddisseg_plan -d {dataset} --encoder_weights {output}" if kind == "meddisseg_encoder"
           else f"nnUNetv2_train {dataset} {configuration} {fold} -p {plans_name} -pretrained_weights {output}")
    print(f"wrote {output} ({seconds / 60:.1f} min); use it with: {use}")
    return record


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter, description=(
        "Self-supervised pretraining (Models Genesis restoration, masked image modelling or SimCLR) on a dataset's "
        "own preprocessed training cases. "
        "With nnU-Net's plans (-p nnUNetPlans) it writes the whole network for nnUNetv2_train ... -pretrained_weights "
        "FILE; with Med-DisSeg's (-p nnUNetMedDisSegPlans) the ResNet-50 encoder for nnUNetv2_meddisseg_plan "
        "--encoder_weights FILE. Run again with the same settings to resume after an interruption."))
    p.add_argument("-d", "--dataset", required=True, help="dataset ID or name, e.g. 501 or Dataset501_Kvasir")
    p.add_argument("-c", "--configuration", default="2d", help="nnU-Net configuration (2D only)")
    p.add_argument("-p", "--plans", default="nnUNetPlans", dest="plans_name",
                   help="plans whose network is pretrained: nnUNetPlans (nnU-Net's default network) or "
                        "nnUNetMedDisSegPlans (Med-DisSeg's encoder)")
    p.add_argument("-f", "--fold", required=True, help="fold whose training cases are used (0-4 or all)")
    p.add_argument("-o", "--output", required=True, type=Path,
                   help="weights file to write (its checkpoint <FILE>.checkpoint is kept beside it while running)")
    p.add_argument("--epochs", type=int, default=100, help="epochs")
    p.add_argument("--iterations_per_epoch", type=int, default=250, help="batches per epoch")
    p.add_argument("--method", default="masked", choices=tuple(METHODS),
                   help="masked: masked image modelling (SparK's masking); restoration: Models Genesis; "
                        "contrastive: SimCLR")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialisation, sampling, augmentation and "
                                                       "corruptions")
    add_device_argument(p)
    p.add_argument("--unlabelled_folder", type=Path, default=None,
                   help="also pretrain on the images of this folder, in the dataset's raw format "
                        "(<case>_0000<file_ending>; default: none)")
    p.add_argument("--use_validation_cases", action="store_true",
                   help="also pretrain on the fold's validation cases (then they no longer measure the fine-tuned "
                        "model without bias)")
    p.add_argument("--no_progress", dest="progress", action="store_false", help="no progress bar")
    return p


def _command(argv: Optional[Sequence[str]]) -> None:
    run_pretraining(**vars(_parser().parse_args(argv)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
