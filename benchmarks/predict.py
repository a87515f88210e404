"""Wall time of ``nnUNetv2_predict`` per image: default nnU-Net vs Med-DisSeg on the same test images.

Every timing is a whole ``nnUNetv2_predict ... -npp 1 -nps 1`` process on a folder of N images and on its first
image alone (per image, marginal per image and start-up follow), all candidates alternating in rounds; with and
without mirroring (``--tta``), and with ``--cpu-bf16`` also Med-DisSeg under CPU bf16 autocast with the agreement
of its masks with fp32. By default on a generated dataset with untrained model folders (prediction time does not
depend on the weights); ``--dataset ID`` times existing trained models. benchmarks/README.md has the details.
"""
import argparse
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from common import (
    argument_parser,
    command_line,
    dataset_folder,
    load_average,
    machine_info,
    markdown_table,
    parse_device,
    report,
    summarize,
)

from nnunetv2_meddisseg.environment import (
    CPU_BF16_ENVIRONMENT_VARIABLE,
    nnunet_environment,
    planning_environment,
    set_nnunet_environment,
    trainer_output_folder,
)
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.logged_command import CommandFailed, run_logged
from nnunetv2_meddisseg.torch_files import check_model_folder_checkpoints

CONFIGURATION = "2d"
SYNTHETIC_DATASET_ID = 990
SYNTHETIC_TRAINING_CASES = 8  # planning needs a fingerprint of some training cases; they are never trained on
MODEL_KEYS = ("default", "meddisseg", "meddisseg_bf16")
MODEL_NAMES = {"default": "nnU-Net default", "meddisseg": "Med-DisSeg", "meddisseg_bf16": "Med-DisSeg bf16"}


def calibrate_batch_norm(network, batches: Sequence) -> None:
    """Set the BatchNorm running statistics of a freshly initialised network to those of its own activations
    on ``batches``: with the initial ones an untrained ResNet-50 in eval mode produces logits in the thousands,
    which overflow nnU-Net's half-precision logit accumulator. Prediction runs the same operations either way."""
    from nnunetv2_meddisseg.training.batchnorm_statistics import batchnorm_layers, recalibrate_batchnorm

    if not batchnorm_layers([network]):
        return
    recalibrate_batchnorm([network], batches, network)


def _calibration_batches(trainer, max_cases: int = 8, batch_size: int = 2) -> list:
    """Up to ``max_cases`` training images of the trainer's dataset, preprocessed as nnU-Net preprocesses them
    for prediction, centre-cropped / zero-padded to the patch size, in batches (B, C, H, W)."""
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
    """Write ``$nnUNet_results/DatasetXXX/TRAINER__PLANS__2d/`` as a finished training leaves it for prediction
    (``plans.json``, ``dataset.json``, ``fold_F/<checkpoint>``), with the network as the trainer initialises
    it. Runs in a subprocess whose environment holds the nnU-Net folders."""
    import torch
    from batchgenerators.utilities.file_and_folder_operations import save_json
    from nnunetv2.run.run_training import get_trainer_from_args

    trainer = get_trainer_from_args(dataset, CONFIGURATION, fold, trainer_name, plans, device=torch.device("cpu"))
    trainer.initialize()
    calibrate_batch_norm(trainer.network, _calibration_batches(trainer))
    trainer.configure_rotation_dummyDA_mirroring_and_inital_patch_size()  # the mirroring axes, as before training
    os.makedirs(trainer.output_folder, exist_ok=True)
    save_json(trainer.plans_manager.plans, os.path.join(trainer.output_folder_base, "plans.json"), sort_keys=False)
    save_json(trainer.dataset_json, os.path.join(trainer.output_folder_base, "dataset.json"), sort_keys=False)
    target = Path(trainer.output_folder) / checkpoint
    trainer.save_checkpoint(str(target))
    print(f"wrote {target} (untrained {trainer.network.__class__.__name__} of {trainer_name})")
    return target


def _copy_cases(folder: Path, file_ending: str, count: Optional[int], target: Path) -> List[str]:
    """Copy the channel files (``CASE_XXXX<ending>``) of the first ``count`` cases (None: all) of an nnU-Net
    image folder to ``target``; returns the cases."""
    files: Dict[str, List[Path]] = {}
    for f in sorted(folder.glob(f"*_[0-9][0-9][0-9][0-9]{file_ending}")):
        files.setdefault(f.name[:-len(file_ending) - 5], []).append(f)
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    cases = sorted(files)[:count]
    for f in (f for c in cases for f in files[c]):
        shutil.copy2(f, target / f.name)
    return cases


def _architecture(model_folder: Path) -> Tuple[str, Optional[list]]:
    """(network class, patch size) of the 2d configuration in a model folder's plans.json."""
    config = json.loads((model_folder / "plans.json").read_text())["configurations"][CONFIGURATION]
    name = config.get("architecture", {}).get("network_class_name", "?")
    return name.rsplit(".", 1)[-1], config.get("patch_size")


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text).strip("_")


def _prepare_generated(args, work: Path, logs: Path) -> Tuple[Dict[str, str], str]:
    """Generate, plan and preprocess the synthetic dataset and write both model folders."""
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    env = nnunet_environment(work)
    env.setdefault("nnUNet_def_n_proc", "2")
    dataset = str(SYNTHETIC_DATASET_ID)
    print(f"[1/4] generated dataset ({args.size}x{args.size}, {args.num_images} test images) -> {env['nnUNet_raw']}")
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=SYNTHETIC_DATASET_ID, num_train=SYNTHETIC_TRAINING_CASES,
                           num_test=args.num_images, size=args.size, seed=0, overwrite=True)
    print("[2/4] nnU-Net planning and preprocessing, Med-DisSeg plan")
    run_logged(["nnUNetv2_plan_and_preprocess", "-d", dataset, "-c", CONFIGURATION, "-np", "2"],
               planning_environment(env), logs / "plan_and_preprocess.log")
    run_logged(["nnUNetv2_meddisseg_plan", "-d", dataset, "--plans_name", args.plans], env,
               logs / "meddisseg_plan.log")
    print("[3/4] model folders with untrained networks (prediction time does not depend on the weights)")
    for trainer, plans in ((args.baseline_trainer, args.baseline_plans), (args.trainer, args.plans)):
        run_logged(["python", str(Path(__file__).resolve()), "--make-model-folder", "--dataset", dataset,
                    "--trainer", trainer, "--plans", plans, "--fold", str(args.fold), "--checkpoint",
                    args.checkpoint], env, logs / f"model_folder_{trainer}__{plans}.log")
    return env, dataset


def _predict_command(dataset: str, images: Path, out: Path, trainer: str, plans: str, tta: bool, args) -> List[str]:
    command = ["nnUNetv2_predict", "-i", str(images), "-o", str(out), "-d", dataset, "-c", CONFIGURATION,
               "-f", str(args.fold), "-tr", trainer, "-p", plans, "-chk", args.checkpoint, "-device", args.device,
               "-npp", "1", "-nps", "1", "--disable_progress_bar"]
    return command if tta else command + ["--disable_tta"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argument_parser(__doc__, "predict")
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
    p.add_argument("--work", default=None, help="folder for the nnU-Net folders, images, predictions and logs "
                                                "(default: a temporary folder, removed at the end)")
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

    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_predict_")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    try:
        payload = _run(args, work, work / "logs")
    except CommandFailed as e:  # its one-line message names the command and its log
        raise SystemExit(str(e)) from None
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    report(args.out, "predict", payload, _markdown(payload))
    return 0


def _run(args, work: Path, logs: Path) -> dict:
    if args.dataset is None:
        env, dataset = _prepare_generated(args, work, logs)
    else:
        for name in ("nnUNet_raw", "nnUNet_results"):
            if not os.environ.get(name):
                raise SystemExit(f"--dataset: the environment variable {name} is not set (it must point at the "
                                 f"nnU-Net folders holding the trained models)")
        env, dataset = set_nnunet_environment(dict(os.environ)), args.dataset
        print(f"[1-3/4] existing models of dataset {dataset} ({env['nnUNet_results']})")
    results_dataset = dataset_folder(env["nnUNet_results"], dataset)
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
        try:  # read weights-only before nnUNetv2_predict loads it with weights_only=False
            check_model_folder_checkpoints(folder, [args.fold], args.checkpoint)
        except UserError as e:
            raise SystemExit(f"{MODEL_NAMES[k]}: {e}") from None
    file_ending = json.loads((folders["default"] / "dataset.json").read_text()).get("file_ending", ".png")
    image_source = Path(args.images) if args.images else dataset_folder(env["nnUNet_raw"], dataset) / "imagesTs"
    if not image_source.is_dir():
        raise SystemExit(f"test image folder {image_source} not found (pass --images)")
    cases = _copy_cases(image_source, file_ending, args.num_images, work / "images" / "n_images")
    n = len(cases)
    if n < 2:
        raise SystemExit(f"{image_source}: need at least 2 test images ending in _0000{file_ending}, found {n}")
    folders_in = {n: work / "images" / "n_images", 1: work / "images" / "1_image"}
    _copy_cases(image_source, file_ending, 1, folders_in[1])

    tta_modes = {"on": [True], "off": [False], "both": [True, False]}[args.tta]
    candidates = {f"{MODEL_NAMES[k]} / TTA {'on' if tta else 'off'} / {count} image{'s' if count > 1 else ''}":
                  (k, trainer, plans, tta, count)
                  for k, (trainer, plans) in models.items() for tta in tta_modes for count in (n, 1)}

    def run_one(key: str, label: str) -> float:
        model, trainer, plans, tta, count = candidates[key]
        out, log = work / "predictions" / _slug(key), logs / "predict" / f"{_slug(key)}_{label}.log"
        shutil.rmtree(out, ignore_errors=True)
        seconds = run_logged(_predict_command(dataset, folders_in[count], out, trainer, plans, tta, args),
                             environments[model], log, echo=False)
        written = len([f for f in out.iterdir() if f.name.endswith(file_ending)]) if out.is_dir() else 0
        if written != count:
            raise SystemExit(f"{key}: nnUNetv2_predict wrote {written} of {count} predictions (log: {log})")
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
    for r in range(args.repeats):  # all candidates in each round, the order rotating
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            times[key].append(run_one(key, f"round{r}"))

    stats = {k: summarize(v) for k, v in times.items()}
    derived = {f"tta_{'on' if tta else 'off'}": per_image(stats, n, tta, list(models)) for tta in tta_modes}
    for tta in tta_modes if args.cpu_bf16 else ():
        fp32, bf16 = (work / "predictions" / _slug(f"{MODEL_NAMES[k]} / TTA {'on' if tta else 'off'} / {n} images")
                      for k in ("meddisseg", "meddisseg_bf16"))
        derived[f"tta_{'on' if tta else 'off'}"]["bf16_vs_fp32_mean_dice"] = mask_agreement(fp32, bf16, file_ending)
    architectures = {k: dict(zip(("network", "patch_size"), _architecture(f))) for k, f in folders.items()}
    return {"machine": machine_info(args.device), "command": command_line(),
            "models": "generated" if args.dataset is None else "existing", "dataset": results_dataset.name,
            "images": n, "image_size": args.size if args.dataset is None else None,
            "trainers": {k: {"trainer": t, "plans": pl, **architectures[k]} for k, (t, pl) in models.items()},
            "tta": args.tta, "device": args.device, "fold": args.fold, "repeats": args.repeats,
            "warmup": args.warmup, "example_command": " ".join(example), "timings": stats, "per_image": derived,
            "load_average_after": load_average()}


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
    weights = ("untrained networks (BatchNorm statistics calibrated on the training images)"
               if payload["models"] == "generated" else "trained models")
    tr = {k: f"{v['trainer']} / {v['plans']} ({v['network']}, patch {v['patch_size']})"
          for k, v in payload["trainers"].items()}
    out = [f"`nnUNetv2_predict` on {n} {size}RGB test images of {payload['dataset']}, device {payload['device']}, "
           f"`-npp 1 -nps 1`, {weights}. Default nnU-Net: {tr['default']}; Med-DisSeg: {tr['meddisseg']}. Every "
           f"time is the wall time of a whole `nnUNetv2_predict` process; {payload['warmup']} warm-up + "
           f"{payload['repeats']} timed rounds, all candidates alternating; median. Load average after the run: "
           f"{payload['load_average_after']}.", "", f"Example: `{payload['example_command']}`", ""]
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
            "start-up = 1-image run - marginal per image. TTA on = nnU-Net's default mirroring; off = "
            "`--disable_tta`.", "", "All runs (seconds):", "",
            markdown_table(["candidate", "median", "min", "max", "n"],
                           [[k, f"{s['median_s']:.2f}", f"{s['min_s']:.2f}", f"{s['max_s']:.2f}", s["n"]]
                            for k, s in payload["timings"].items()])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
