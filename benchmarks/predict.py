"""Wall time of ``nnUNetv2_predict`` per image: default nnU-Net vs Med-DisSeg on the same test images.

Every timing is one real ``nnUNetv2_predict -i IMAGES -o OUT -d ID -c 2d -f FOLD -tr TRAINER -p PLANS
-device DEVICE -npp N -nps N`` process, measured from its start to its exit: Python and torch
imports, trainer lookup, network building, checkpoint loading, pre-processing, the sliding-window
forward passes, resampling and export are all included; nothing is subtracted. Each model predicts
the whole image folder (N images) and a folder holding only its first image; the two give

- per image (as a user sees it): wall time of the N-image run / N;
- marginal per image: (N-image run - 1-image run) / (N - 1), the cost of one more image;
- start-up: 1-image run - marginal per image (imports, lookup, building and loading the model).

``--tta on`` is nnU-Net's default mirroring (four forward passes per tile in 2d), ``off`` passes
``--disable_tta``, ``both`` (default) times both. All candidates (model x TTA x folder) run in alternating
rounds, the order rotating per round, after untimed warm-up runs; medians, with the Med-DisSeg / default ratio.

bf16 on the CPU: ``--cpu-bf16`` adds Med-DisSeg predicting with ``nnUNet_meddisseg_cpu_bf16=1`` (its inference
forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``; fast only with AVX512-BF16 or AMX) as a third
candidate, and reports the mean Dice between its masks and the fp32 masks of the same images.

Models. By default everything is built in ``--work``: a generated dataset (``datasets.synthetic``,
``--size`` x ``--size`` RGB, ``--num-images`` test images), planned and preprocessed, and for each trainer
a model folder whose ``checkpoint_final.pth`` holds the freshly initialised network (BatchNorm statistics
calibrated on the training images so that its logits stay finite): the time of a prediction does not
depend on the values of the weights. ``--dataset ID`` times the trained models of an existing nnU-Net
setup instead (folders from the environment; test images from ``--images`` or the dataset's imagesTs).

Usage: ``python benchmarks/predict.py [--size 256] [--num-images 8] [--repeats 3] [--tta both]
[--device cpu|cuda] [--cpu-bf16] [--work DIR] [--dataset ID --images DIR]``
"""
import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from common import (DEFAULT_OUT, command_line, machine_info, markdown_table, parse_device, run_logged, summarize,
                    write_results)
from nnunetv2_meddisseg.environment import CPU_BF16_ENVIRONMENT_VARIABLE, set_nnunet_environment
from nnunetv2_meddisseg.nnunet_env import nnunet_environment, planning_environment, trainer_output_folder

CONFIGURATION = "2d"
SYNTHETIC_DATASET_ID = 990
SYNTHETIC_TRAINING_CASES = 8  # planning needs a fingerprint of some training cases; they are never trained on
MODEL_KEYS = ("default", "meddisseg", "meddisseg_bf16")
MODEL_NAMES = {"default": "nnU-Net default", "meddisseg": "Med-DisSeg", "meddisseg_bf16": "Med-DisSeg bf16"}


# ------------------------------------------------------------------------------------------------
# model folders without training


def calibrate_batch_norm(network, batches: Sequence) -> None:
    """Set the BatchNorm running statistics of a freshly initialised network to those of its own
    activations on ``batches`` (training-mode forwards without gradients; tensors (B, C, H, W)).

    With the initial statistics (mean 0, variance 1) an untrained ResNet-50 in eval mode lets its
    activations grow layer by layer: on real images its logits reach thousands, and nnU-Net's
    half-precision logit accumulator overflows ("Encountered inf in predicted array"). Calibrated
    statistics give finite logits of the size a trained network has; the operations run at
    prediction time, and so their time, are the same.
    """
    import torch
    from torch import nn

    norms = [m for m in network.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
    encoder_only = getattr(network, "encoder_only", None)
    if encoder_only is not None:
        network.encoder_only = False  # Med-DisSeg's trainer starts in Stage I (encoder only)
    network.train()
    with torch.no_grad():
        for batch in batches:
            network(batch)
    network.eval()
    if encoder_only is not None:
        network.encoder_only = encoder_only


def _calibration_batches(trainer, max_cases: int = 8, batch_size: int = 2) -> list:
    """Up to ``max_cases`` training images of the trainer's dataset (``$nnUNet_raw/.../imagesTr``),
    preprocessed as nnU-Net preprocesses them for prediction, centre-cropped / zero-padded to the patch
    size, in batches (B, C, H, W)."""
    import torch
    from nnunetv2.paths import nnUNet_raw
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    folder = os.path.join(nnUNet_raw.get(), trainer.plans_manager.dataset_name, "imagesTr")
    files = create_lists_from_splitted_dataset_folder(folder, trainer.dataset_json["file_ending"])[:max_cases]
    if not files:
        raise SystemExit(f"no training images in {folder} to calibrate the BatchNorm statistics on")
    preprocessor = trainer.configuration_manager.preprocessor_class(verbose=False)
    patch = list(trainer.configuration_manager.patch_size)
    images = []
    for case_files in files:
        data, _, _ = preprocessor.run_case(case_files, None, trainer.plans_manager, trainer.configuration_manager,
                                           trainer.dataset_json)
        x = torch.from_numpy(data).float()[:, 0]  # 2d configuration: (C, 1, H, W) -> (C, H, W)
        canvas = torch.zeros(x.shape[0], *patch)
        src = [slice(max(0, (s - p) // 2), max(0, (s - p) // 2) + min(s, p)) for s, p in zip(x.shape[1:], patch)]
        dst = [slice(max(0, (p - s) // 2), max(0, (p - s) // 2) + min(s, p)) for s, p in zip(x.shape[1:], patch)]
        canvas[(slice(None), *dst)] = x[(slice(None), *src)]
        images.append(canvas)
    return [torch.stack(images[i:i + batch_size]) for i in range(0, len(images), batch_size)
            if len(images[i:i + batch_size]) == batch_size or i == 0]


def make_model_folder(dataset: str, trainer_name: str, plans: str, fold: int, checkpoint: str) -> Path:
    """Write ``$nnUNet_results/DatasetXXX/TRAINER__PLANS__2d/`` as a finished training would leave it
    for prediction (``plans.json``, ``dataset.json``, ``fold_F/<checkpoint>``), with the network as
    the trainer initialises it. Runs in a subprocess whose environment holds the nnU-Net folders."""
    import torch
    from batchgenerators.utilities.file_and_folder_operations import save_json
    from nnunetv2.run.run_training import get_trainer_from_args

    trainer = get_trainer_from_args(dataset, CONFIGURATION, fold, trainer_name, plans, device=torch.device("cpu"))
    trainer.initialize()
    calibrate_batch_norm(trainer.network, _calibration_batches(trainer))
    # what on_train_start would do before training: the mirroring axes recorded for inference ...
    trainer.configure_rotation_dummyDA_mirroring_and_inital_patch_size()
    # ... and the plans / dataset.json next to the folds
    os.makedirs(trainer.output_folder, exist_ok=True)
    save_json(trainer.plans_manager.plans, os.path.join(trainer.output_folder_base, "plans.json"), sort_keys=False)
    save_json(trainer.dataset_json, os.path.join(trainer.output_folder_base, "dataset.json"), sort_keys=False)
    target = Path(trainer.output_folder) / checkpoint
    trainer.save_checkpoint(str(target))
    print(f"wrote {target} (untrained {trainer.network.__class__.__name__} of {trainer_name})")
    return target


# ------------------------------------------------------------------------------------------------
# helpers


def _dataset_folder(root: str, dataset: str) -> Path:
    """``root/DatasetXXX_Name`` for an ID or a name."""
    if dataset.startswith("Dataset"):
        folder = Path(root) / dataset
        if folder.is_dir():
            return folder
        raise SystemExit(f"--dataset {dataset}: {folder} does not exist")
    try:
        prefix = f"Dataset{int(dataset):03d}_"
    except ValueError:
        raise SystemExit(f"--dataset must be an ID (e.g. 501) or a name (Dataset501_Name), got {dataset!r}") from None
    found = sorted(p for p in Path(root).glob(prefix + "*") if p.is_dir())
    if len(found) != 1:
        raise SystemExit(f"--dataset {dataset}: expected one folder {prefix}* in {root}, found "
                         f"{', '.join(p.name for p in found) or 'none'}")
    return found[0]


def _cases(folder: Path, file_ending: str) -> Dict[str, List[Path]]:
    """``{case: [channel files]}`` of an nnU-Net image folder (``CASE_XXXX<ending>``)."""
    cases: Dict[str, List[Path]] = {}
    for f in sorted(folder.iterdir()):
        name = f.name
        if f.is_file() and name.endswith(file_ending) and len(name) > len(file_ending) + 5 \
                and name[-len(file_ending) - 5] == "_" and name[-len(file_ending) - 4:-len(file_ending)].isdigit():
            cases.setdefault(name[:-len(file_ending) - 5], []).append(f)
    return cases


def _copy_cases(cases: Dict[str, List[Path]], names: Sequence[str], target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for c in names:
        for f in cases[c]:
            shutil.copy2(f, target / f.name)
    return target


def _architecture(model_folder: Path) -> Tuple[str, Optional[list]]:
    """(network class, patch size) of the 2d configuration in a model folder's plans.json."""
    config = json.loads((model_folder / "plans.json").read_text())["configurations"][CONFIGURATION]
    name = config.get("architecture", {}).get("network_class_name", "?")
    return name.rsplit(".", 1)[-1], config.get("patch_size")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_")


# ------------------------------------------------------------------------------------------------
# the benchmark


def _prepare_generated(args, work: Path, logs: Path) -> Tuple[Dict[str, str], str]:
    """Generate, plan and preprocess the synthetic dataset and write both model folders."""
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    env = nnunet_environment(work)
    env.setdefault("nnUNet_def_n_proc", "2")
    dataset = str(args.dataset_id)
    print(f"[1/4] generated dataset ({args.size}x{args.size}, {args.num_images} test images) -> {env['nnUNet_raw']}")
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=args.dataset_id, num_train=SYNTHETIC_TRAINING_CASES,
                           num_test=args.num_images, size=args.size, seed=0, overwrite=True)
    print("[2/4] nnU-Net planning and preprocessing, Med-DisSeg plan")
    run_logged(["nnUNetv2_plan_and_preprocess", "-d", dataset, "-c", CONFIGURATION, "-np", "2"],
               planning_environment(env), logs / "plan_and_preprocess.log")
    run_logged(["nnUNetv2_meddisseg_plan", "-d", dataset, "--plans-name", args.plans], env,
               logs / "meddisseg_plan.log")
    print("[3/4] model folders with untrained networks (prediction time does not depend on the weights)")
    for trainer, plans in ((args.baseline_trainer, args.baseline_plans), (args.trainer, args.plans)):
        run_logged(["python", str(Path(__file__).resolve()), "--make-model-folder", "--dataset", dataset,
                    "--trainer", trainer, "--plans", plans, "--fold", str(args.fold), "--checkpoint",
                    args.checkpoint], env, logs / f"model_folder_{trainer}__{plans}.log")
    return env, dataset


def _existing_environment() -> Dict[str, str]:
    env = dict(os.environ)
    for name in ("nnUNet_raw", "nnUNet_results"):
        if not env.get(name):
            raise SystemExit(f"--dataset: the environment variable {name} is not set (it must point at the "
                             f"nnU-Net folders holding the trained models)")
    return set_nnunet_environment(env)


def _predict_command(dataset: str, images: Path, out: Path, trainer: str, plans: str, tta: bool, args) -> List[str]:
    command = ["nnUNetv2_predict", "-i", str(images), "-o", str(out), "-d", dataset, "-c", CONFIGURATION,
               "-f", str(args.fold), "-tr", trainer, "-p", plans, "-chk", args.checkpoint, "-device", args.device,
               "-npp", str(args.npp), "-nps", str(args.nps), "--disable_progress_bar"]
    return command if tta else command + ["--disable_tta"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="image height = width of the generated dataset")
    p.add_argument("--num-images", type=int, default=None,
                   help="test images: generated (default 8), or with --dataset the first N of the folder (default all)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds of 1-image runs of each model first")
    p.add_argument("--tta", choices=("on", "off", "both"), default="both",
                   help="nnU-Net's mirroring test-time augmentation: on (its default), off (--disable_tta) or both")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="nnUNetv2_predict -device")
    p.add_argument("--cpu-bf16", action="store_true",
                   help="also time Med-DisSeg with nnUNet_meddisseg_cpu_bf16=1 (bf16 autocast on the CPU)")
    p.add_argument("--npp", type=int, default=1, help="nnUNetv2_predict -npp (pre-processing processes)")
    p.add_argument("--nps", type=int, default=1, help="nnUNetv2_predict -nps (export processes)")
    p.add_argument("--work", default=None,
                   help="folder for the nnU-Net folders, images, predictions and logs (default: a temporary "
                        "folder, removed at the end unless --keep-work)")
    p.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    p.add_argument("--dataset-id", type=int, default=SYNTHETIC_DATASET_ID, help="ID of the generated dataset")
    p.add_argument("--dataset", default=None,
                   help="time existing trained models of this dataset (ID or name) instead; nnUNet_raw and "
                        "nnUNet_results come from the environment")
    p.add_argument("--images", default=None, help="with --dataset: test image folder (default: its imagesTs)")
    p.add_argument("--baseline-trainer", default="nnUNetTrainer")
    p.add_argument("--baseline-plans", default="nnUNetPlans")
    p.add_argument("--trainer", default="nnUNetTrainerMedDisSeg")
    p.add_argument("--plans", default="nnUNetMedDisSegPlans")
    p.add_argument("--fold", default="0")
    p.add_argument("--checkpoint", default="checkpoint_final.pth")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for predict.json / .md")
    p.add_argument("--make-model-folder", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.make_model_folder:
        make_model_folder(args.dataset, args.trainer, args.plans, int(args.fold), args.checkpoint)
        return 0
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")
    if args.dataset is None and (args.size < 32 or args.size % 16):
        raise SystemExit(f"--size must be a multiple of 16 and at least 32, got {args.size}")
    if args.dataset is None and args.num_images is None:
        args.num_images = 8
    if args.cpu_bf16 and args.device != "cpu":
        raise SystemExit("--cpu-bf16 needs --device cpu")
    if args.num_images is not None and args.num_images < 2:
        raise SystemExit(f"--num-images must be at least 2 (the 1-image run separates start-up), got {args.num_images}")

    parse_device(args.device)

    temporary = args.work is None
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_predict_")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    try:
        payload = _run(args, work, logs)
    finally:
        if temporary and not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    files = write_results(args.out, "predict", payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    return 0


def _run(args, work: Path, logs: Path) -> dict:
    if args.dataset is None:
        env, dataset = _prepare_generated(args, work, logs)
        source = "generated"
    else:
        env, dataset = _existing_environment(), args.dataset
        source = "existing"
        print(f"[1-3/4] existing models of dataset {dataset} ({env['nnUNet_results']})")
    results_dataset = _dataset_folder(env["nnUNet_results"], dataset)
    models = {"default": (args.baseline_trainer, args.baseline_plans), "meddisseg": (args.trainer, args.plans)}
    if args.cpu_bf16:
        models["meddisseg_bf16"] = models["meddisseg"]
    folders = {k: trainer_output_folder(results_dataset.name, t, pl, CONFIGURATION, results=str(results_dataset.parent))
               for k, (t, pl) in models.items()}
    environments = {k: dict(env, **({CPU_BF16_ENVIRONMENT_VARIABLE: "1"} if k == "meddisseg_bf16" else {}))
                    for k in models}
    for k, folder in folders.items():
        ckpt = folder / f"fold_{args.fold}" / args.checkpoint
        if not ckpt.is_file():
            raise SystemExit(f"{MODEL_NAMES[k]}: {ckpt} not found (train the model first, or check --trainer / "
                             f"--plans / --fold / --checkpoint)")
    file_ending = json.loads((folders["default"] / "dataset.json").read_text()).get("file_ending", ".png")
    if args.images:
        image_source = Path(args.images)
    else:
        image_source = _dataset_folder(env["nnUNet_raw"], dataset) / "imagesTs"
    if not image_source.is_dir():
        raise SystemExit(f"test image folder {image_source} not found (pass --images)")
    cases = _cases(image_source, file_ending)
    names = sorted(cases)
    if args.num_images is not None:
        names = names[:args.num_images]
    if len(names) < 2:
        raise SystemExit(f"{image_source}: need at least 2 test images ending in _0000{file_ending}, "
                         f"found {len(names)}")
    n = len(names)
    folders_in = {n: _copy_cases(cases, names, work / "images" / f"{n}_images"),
                  1: _copy_cases(cases, names[:1], work / "images" / "1_image")}

    tta_modes = {"on": [True], "off": [False], "both": [True, False]}[args.tta]
    candidates = {}
    for k, (trainer, plans) in models.items():
        for tta in tta_modes:
            for count in (n, 1):
                key = f"{MODEL_NAMES[k]} / TTA {'on' if tta else 'off'} / {count} image{'s' if count > 1 else ''}"
                candidates[key] = (k, trainer, plans, tta, count)

    def run_one(key: str, label: str) -> float:
        model, trainer, plans, tta, count = candidates[key]
        out = work / "predictions" / _slug(key)
        if out.exists():
            shutil.rmtree(out)
        seconds = run_logged(_predict_command(dataset, folders_in[count], out, trainer, plans, tta, args),
                             environments[model],
                             logs / "predict" / f"{_slug(key)}_{label}.log", echo=False)
        written = len([f for f in out.iterdir() if f.name.endswith(file_ending)]) if out.is_dir() else 0
        if written != count:
            raise SystemExit(f"{key}: nnUNetv2_predict wrote {written} of {count} predictions "
                             f"(log: {logs / 'predict' / f'{_slug(key)}_{label}.log'})")
        print(f"    {label:>8}  {key:<48} {seconds:7.2f} s", flush=True)
        return seconds

    example = _predict_command(dataset, folders_in[n], work / "predictions" / "OUT", args.trainer, args.plans,
                               tta_modes[0], args)
    print(f"[4/4] timing nnUNetv2_predict: {len(candidates)} candidates x {args.repeats} rounds "
          f"(+ {args.warmup} warm-up), e.g.\n  $ {' '.join(example)}")
    for w in range(args.warmup):
        for key, c in candidates.items():
            if c[4] == 1 and c[3] == tta_modes[-1]:
                run_one(key, f"warmup{w}")
    times: Dict[str, List[float]] = {k: [] for k in candidates}
    keys = list(candidates)
    for r in range(args.repeats):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[key].append(run_one(key, f"round{r}"))

    stats = {k: summarize(v) for k, v in times.items()}
    derived = {f"tta_{'on' if tta else 'off'}": per_image(stats, n, tta, list(models)) for tta in tta_modes}
    if args.cpu_bf16:
        for tta in tta_modes:
            keys_fp32_bf16 = [_slug(f"{MODEL_NAMES[k]} / TTA {'on' if tta else 'off'} / {n} images")
                              for k in ("meddisseg", "meddisseg_bf16")]
            derived[f"tta_{'on' if tta else 'off'}"]["bf16_vs_fp32_mean_dice"] = mask_agreement(
                *(work / "predictions" / k for k in keys_fp32_bf16), file_ending)
    architectures = {k: dict(zip(("network", "patch_size"), _architecture(f))) for k, f in folders.items()}
    return {"machine": machine_info(args.device), "command": command_line(), "models": source,
            "dataset": results_dataset.name, "images": n, "image_size": args.size if source == "generated" else None,
            "trainers": {k: {"trainer": t, "plans": pl, **architectures[k]} for k, (t, pl) in models.items()},
            "tta": args.tta, "npp": args.npp, "nps": args.nps, "device": args.device, "fold": args.fold,
            "repeats": args.repeats, "warmup": args.warmup, "example_command": " ".join(example),
            "timings": stats, "per_image": derived, "load_average_after": [round(v, 2) for v in os.getloadavg()]}


def mask_agreement(first: Path, second: Path, file_ending: str) -> float:
    """Mean over the images of the Dice between the foreground (label > 0) of two folders of predicted masks."""
    import numpy as np
    import SimpleITK as sitk

    scores = []
    for a in sorted(first.glob(f"*{file_ending}")):
        x, y = (sitk.GetArrayFromImage(sitk.ReadImage(str(f))) > 0 for f in (a, second / a.name))
        total = x.sum() + y.sum()
        scores.append(1.0 if total == 0 else 2.0 * float((x & y).sum()) / float(total))
    return float(np.mean(scores)) if scores else float("nan")


def per_image(stats: Dict[str, dict], n: int, tta: bool, models: Sequence[str] = MODEL_KEYS[:2]) -> dict:
    """Per-image figures of the models from the medians of their N-image and 1-image runs."""
    t = "on" if tta else "off"
    row: Dict[str, object] = {}
    for k in models:
        full = stats[f"{MODEL_NAMES[k]} / TTA {t} / {n} images"]["median_s"]
        one = stats[f"{MODEL_NAMES[k]} / TTA {t} / 1 image"]["median_s"]
        marginal = (full - one) / (n - 1)
        row[k] = {"run_s": full, "one_image_run_s": one, "per_image_s": full / n,
                  "marginal_per_image_s": marginal, "startup_s": one - marginal}
    default, meddisseg = row["default"], row["meddisseg"]
    row["ratio_per_image"] = meddisseg["per_image_s"] / default["per_image_s"]
    row["ratio_marginal_per_image"] = (meddisseg["marginal_per_image_s"] / default["marginal_per_image_s"]
                                       if default["marginal_per_image_s"] > 0 else float("nan"))
    if "meddisseg_bf16" in row:
        row["ratio_bf16_over_fp32_per_image"] = row["meddisseg_bf16"]["per_image_s"] / meddisseg["per_image_s"]
    return row


def _markdown(payload: dict) -> str:
    n = payload["images"]
    size = f"{payload['image_size']}x{payload['image_size']} " if payload["image_size"] else ""
    weights = ("untrained networks (freshly initialised checkpoints, BatchNorm statistics calibrated on the "
               "training images: prediction time does not depend on the weights' values)"
               if payload["models"] == "generated" else "trained models")
    tr = payload["trainers"]
    out = [f"`nnUNetv2_predict` on {n} {size}RGB test images of {payload['dataset']}, device "
           f"{payload['device']}, `-npp {payload['npp']} -nps {payload['nps']}`, {weights}. Default nnU-Net: "
           f"{tr['default']['trainer']} / {tr['default']['plans']} ({tr['default']['network']}, patch "
           f"{tr['default']['patch_size']}); Med-DisSeg: {tr['meddisseg']['trainer']} / {tr['meddisseg']['plans']} "
           f"({tr['meddisseg']['network']}, patch {tr['meddisseg']['patch_size']}). Every time is the wall time of "
           f"a whole `nnUNetv2_predict` process (start-up included, nothing subtracted); {payload['warmup']} "
           f"warm-up + {payload['repeats']} timed rounds, all candidates alternating; median. Load average "
           f"after the run: {payload['load_average_after']}.", "",
           f"Example: `{payload['example_command']}`", ""]
    rows = []
    for tta, row in payload["per_image"].items():
        t = tta.split("_")[1]
        for k in [k for k in MODEL_KEYS if k in row]:
            r = row[k]
            rows.append([MODEL_NAMES[k], t, f"{r['run_s']:.2f}", f"**{r['per_image_s']:.2f}**",
                         f"{r['one_image_run_s']:.2f}", f"{r['marginal_per_image_s']:.2f}", f"{r['startup_s']:.2f}"])
        marginal = row["ratio_marginal_per_image"]
        rows.append(["ratio Med-DisSeg / default", t, "", f"**{row['ratio_per_image']:.2f}x**", "",
                     "n/a" if math.isnan(marginal) or marginal <= 0 else f"{marginal:.2f}x", ""])
        if "ratio_bf16_over_fp32_per_image" in row:
            rows.append(["ratio Med-DisSeg bf16 / fp32", t, "", f"**{row['ratio_bf16_over_fp32_per_image']:.2f}x**",
                         "", f"mean Dice bf16 vs fp32 masks {row['bf16_vs_fp32_mean_dice']:.4f}", ""])
    out.append(markdown_table(["model", "TTA", f"{n}-image run s", "per image s (run / N)", "1-image run s",
                               "marginal per image s", "start-up s"], rows))
    out += ["", "per image = N-image run / N; marginal per image = (N-image run - 1-image run) / (N - 1); "
            "start-up = 1-image run - marginal per image (imports, trainer lookup, network building, checkpoint "
            "loading). TTA on = nnU-Net's default mirroring (4 forward passes per tile in 2d); off = "
            "`--disable_tta`.", "", "All runs (seconds):", "",
            markdown_table(["candidate", "median", "min", "max", "n"],
                           [[k, f"{s['median_s']:.2f}", f"{s['min_s']:.2f}", f"{s['max_s']:.2f}", s["n"]]
                            for k, s in payload["timings"].items()])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
