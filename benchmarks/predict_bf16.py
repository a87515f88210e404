"""CPU prediction of a trained Med-DisSeg model through ``nnUNetv2_predict``: fp32 vs bfloat16.

The two candidates differ only in the environment variable ``nnUNet_meddisseg_cpu_bf16`` (unset vs
``1``), which makes ``MedDisSegNet``'s inference forward run under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Both run the same command, ``nnUNetv2_predict -i
IMAGES -o OUT -d ID -c 2d -f FOLD -tr TRAINER -p PLANS -device cpu -npp N -nps N`` (as
``benchmarks/predict.py`` times it: whole processes, nothing subtracted).

Phases:

1. The model. By default the Med-DisSeg model of ``benchmarks/quality.py``'s work folder layout
   (``--work``): Kvasir-SEG converted at ``--size`` and preprocessed with quality.py's functions,
   ``nnUNetTrainerMedDisSeg`` trained for quality.py's budget (its recipe override file: ``--iterations`` in
   epochs of ``--iterations-per-epoch``, ``--batch``, ``--threads``). Skipped
   when the checkpoint exists, e.g. in the work folder of an earlier quality.py run.
2. Speed: each candidate predicts the test folder (N images) and a folder holding its first image,
   in alternating rounds (order rotating per round) after an untimed warm-up; medians. Per image =
   N-image run / N; marginal per image = (N-image run - 1-image run) / (N - 1); images/s after
   start-up = 1 / marginal per image; start-up = 1-image run - marginal per image.
3. Agreement, from the N-image predictions of the last round: per-image Dice between the fp32 and
   the bf16 mask, and each candidate's test mIoU / mDSC against the reference masks
   (``nnunetv2_meddisseg.evaluation.metrics.binary_metrics``), with the mDSC change in points.

The CPU model and its flags (``lscpu``) are recorded; bf16 autocast is only fast with AVX512-BF16
or AMX (``avx512_bf16`` / ``amx_bf16``).

Usage: ``python benchmarks/predict_bf16.py [--work DIR] [--kvasir PATH] [--size 64] [--iterations 160]
[--repeats 2] [--tta off|on]``
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from common import command_line, DEFAULT_OUT, machine_info, markdown_table, nnunet_environment, run_logged, \
    summarize, write_results
from predict import _cases, _copy_cases, _slug
import quality

ENV = "nnUNet_meddisseg_cpu_bf16"
CANDIDATES = {"fp32": None, "bf16": "1"}
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx512_vnni", "avx512_fp16")


def cpu_flags() -> dict:
    """Model name and flags of ``lscpu`` (empty when unavailable), with the bf16-relevant subset."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"model": None, "flags": [], "bf16_flags": []}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name", "").strip() or None, "flags": flags,
            "bf16_flags": [f for f in BF16_FLAGS if f in flags]}


def _model_folder(env: Dict[str, str], dataset_name: str, batch: int) -> Path:
    plans = f"nnUNetMedDisSegPlans_bs{batch}"
    trainer = quality.budget_trainer("meddisseg")
    return Path(env["nnUNet_results"]) / dataset_name / f"{trainer}__{plans}__{quality.CONFIGURATION}"


def train_model(args, work: Path, env: Dict[str, str], logs: Path) -> Path:
    """Phase 1: quality.py's data preparation and Med-DisSeg trained for its budget; returns the model folder
    (an existing trained one is reused)."""
    epochs = args.iterations // args.iterations_per_epoch
    found = sorted(Path(env["nnUNet_raw"]).glob(f"Dataset{args.dataset_id:03d}_*"))
    if len(found) == 1:
        folder = _model_folder(env, found[0].name, args.batch)
        if (folder / f"fold_{quality.FOLD}" / "checkpoint_final.pth").is_file():
            print(f"[1/3] reusing the trained model {folder}")
            return folder
    if args.kvasir is None:
        raise SystemExit(f"predict_bf16.py: error: --kvasir is required to train the model (or set "
                         f"{quality.DATA_VARIABLE} to the folder holding Kvasir-SEG/)")
    quality._prepare_data(args, Path(args.kvasir).resolve(), env, work, quality.Deadline(math.inf, math.inf))
    name = quality._dataset_folder(env["nnUNet_raw"], args.dataset_id).name
    folder = _model_folder(env, name, args.batch)
    plans, trainer = folder.name.split("__")[1], folder.name.split("__")[0]
    print(f"[1/3] training Med-DisSeg: {args.iterations} iterations ({epochs} epochs), batch {args.batch}")
    run_logged(["nnUNetv2_meddisseg_plan", "-d", str(args.dataset_id), "--batch-size", str(args.batch),
                "--plans-name", plans], env, logs / "meddisseg_plan.log")
    budget = quality.write_budget(work / "recipes", f"it{args.iterations}_bs{args.batch}", epochs,
                                  args.iterations_per_epoch, args.val_iterations, False, args.threads)
    run_logged(["nnUNetv2_train", str(args.dataset_id), quality.CONFIGURATION, quality.FOLD, "-tr", trainer, "-p",
                plans, "-device", "cpu"], {**env, quality.RECIPE_ENVIRONMENT_VARIABLE: str(budget)},
               logs / f"train_{trainer}.log")
    return folder


def _read_mask(path: Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path))


def agreement(fp32_dir: Path, bf16_dir: Path, reference_dir: Path, file_ending: str) -> dict:
    """Per-image Dice between the two prediction folders and each one's metrics against the references."""
    from nnunetv2_meddisseg.evaluation.metrics import binary_metrics

    names = sorted(f.name for f in fp32_dir.iterdir() if f.name.endswith(file_ending))
    rows = []
    for name in names:
        a, b, ref = (_read_mask(d / name) for d in (fp32_dir, bf16_dir, reference_dir))
        rows.append({"case": name[:-len(file_ending)], "dice_fp32_vs_bf16": binary_metrics(a, b)["dice"],
                     "pixels_differing": int(np.count_nonzero((a != 0) != (b != 0))), "pixels": int(a.size),
                     "fp32": binary_metrics(a, ref), "bf16": binary_metrics(b, ref)})
    dice = np.array([r["dice_fp32_vs_bf16"] for r in rows])
    test = {c: {m: 100 * float(np.mean([r[c][m] for r in rows])) for m in ("iou", "dice")} for c in CANDIDATES}
    return {"images": len(rows), "dice_fp32_vs_bf16": {"mean": float(dice.mean()), "min": float(dice.min()),
                                                       "median": float(np.median(dice)),
                                                       "identical_masks": int(sum(r["pixels_differing"] == 0
                                                                                  for r in rows))},
            "pixels_differing_fraction": sum(r["pixels_differing"] for r in rows) / sum(r["pixels"] for r in rows),
            "test_percent": test, "mdsc_change_points": test["bf16"]["dice"] - test["fp32"]["dice"],
            "per_image": rows}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", default=None, help="quality.py-style work folder (default: a new temporary folder, "
                                                "kept); its trained Med-DisSeg model is reused")
    p.add_argument("--kvasir", default=quality._default_kvasir(),
                   help=f"Kvasir-SEG folder (images/, masks/; default: ${quality.DATA_VARIABLE}/Kvasir-SEG)")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--iterations", type=int, default=160)
    p.add_argument("--iterations-per-epoch", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--val-iterations", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    p.add_argument("--num-processes", type=int, default=2, help="processes for conversion and preprocessing")
    p.add_argument("--dataset-id", type=int, default=quality.DATASET_ID)
    p.add_argument("--num-images", type=int, default=None, help="first N test images (default: all)")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds of 1-image runs first")
    p.add_argument("--tta", choices=("on", "off"), default="off",
                   help="nnU-Net's mirroring test-time augmentation (off: --disable_tta)")
    p.add_argument("--npp", type=int, default=1)
    p.add_argument("--nps", type=int, default=1)
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for predict_bf16.json / .md")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    args.max_train_cases = args.max_test_cases = None  # quality._prepare_data's options
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")
    if args.iterations < 1 or args.iterations_per_epoch < 1 or args.iterations % args.iterations_per_epoch:
        raise SystemExit(f"--iterations ({args.iterations}) must be a positive multiple of --iterations-per-epoch "
                         f"({args.iterations_per_epoch})")
    if args.num_images is not None and args.num_images < 2:
        raise SystemExit(f"--num-images must be at least 2 (the 1-image run separates start-up), got {args.num_images}")
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_predict_bf16_")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = nnunet_environment(work, [])
    env.setdefault("nnUNet_def_n_proc", str(args.num_processes))
    env.setdefault("nnUNet_n_proc_DA", "2")
    env.pop(ENV, None)
    folder = train_model(args, work, env, logs)
    payload = _measure(args, work, env, logs, folder)
    files = write_results(args.out, "predict_bf16", payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']} (predictions and logs: {work})")
    return 0


def _measure(args, work: Path, env: Dict[str, str], logs: Path, folder: Path) -> dict:
    raw = quality._dataset_folder(env["nnUNet_raw"], args.dataset_id)
    file_ending = json.loads((folder / "dataset.json").read_text()).get("file_ending", ".png")
    cases = _cases(raw / "imagesTs", file_ending)
    names = sorted(cases)[:args.num_images] if args.num_images else sorted(cases)
    n = len(names)
    inputs = {n: _copy_cases(cases, names, work / "images" / f"{n}_images"),
              1: _copy_cases(cases, names[:1], work / "images" / "1_image")}
    trainer, plans = folder.name.split("__")[:2]

    def command(images: Path, out: Path) -> List[str]:
        c = ["nnUNetv2_predict", "-i", str(images), "-o", str(out), "-d", str(args.dataset_id), "-c",
             quality.CONFIGURATION, "-f", quality.FOLD, "-tr", trainer, "-p", plans, "-device", "cpu", "-npp",
             str(args.npp), "-nps", str(args.nps), "--disable_progress_bar"]
        return c if args.tta == "on" else c + ["--disable_tta"]

    def run_one(candidate: str, count: int, label: str) -> float:
        key = f"{candidate} / {count} image{'s' if count > 1 else ''}"
        out = work / "predictions" / _slug(key)
        shutil.rmtree(out, ignore_errors=True)
        run_env = dict(env, **({ENV: CANDIDATES[candidate]} if CANDIDATES[candidate] else {}))
        seconds = run_logged(command(inputs[count], out), run_env, logs / "predict_bf16" / f"{_slug(key)}_{label}.log",
                             echo=False)
        written = len([f for f in out.iterdir() if f.name.endswith(file_ending)]) if out.is_dir() else 0
        if written != count:
            raise SystemExit(f"{key}: nnUNetv2_predict wrote {written} of {count} predictions")
        print(f"    {label:>8}  {key:<16} {seconds:7.2f} s", flush=True)
        return seconds

    print(f"[2/3] timing nnUNetv2_predict fp32 vs bf16 ({ENV}=1) on {n} test images, {args.repeats} rounds "
          f"(+ {args.warmup} warm-up)\n  $ {' '.join(command(inputs[n], work / 'predictions' / 'OUT'))}")
    for w in range(args.warmup):
        for candidate in CANDIDATES:
            run_one(candidate, 1, f"warmup{w}")
    keys = [(c, count) for count in (n, 1) for c in CANDIDATES]
    times: Dict[str, List[float]] = {f"{c} / {k}": [] for c, k in keys}
    for r in range(args.repeats):
        shift = r % len(keys)
        for c, count in keys[shift:] + keys[:shift]:
            times[f"{c} / {count}"].append(run_one(c, count, f"round{r}"))
    stats = {k: summarize(v) for k, v in times.items()}
    speed = {}
    for c in CANDIDATES:
        full, one = stats[f"{c} / {n}"]["median_s"], stats[f"{c} / 1"]["median_s"]
        marginal = (full - one) / (n - 1)
        speed[c] = {"run_s": full, "one_image_run_s": one, "per_image_s": full / n, "marginal_per_image_s": marginal,
                    "images_per_s_after_startup": 1 / marginal if marginal > 0 else None,
                    "startup_s": one - marginal}
    speed["speedup_after_startup"] = speed["fp32"]["marginal_per_image_s"] / speed["bf16"]["marginal_per_image_s"]
    speed["speedup_per_image"] = speed["fp32"]["per_image_s"] / speed["bf16"]["per_image_s"]
    print("[3/3] agreement of the fp32 and bf16 predictions")
    agree = agreement(*(work / "predictions" / _slug(f"{c} / {n} images") for c in CANDIDATES),
                      raw / "labelsTs", file_ending)
    return {"machine": machine_info("cpu"), "cpu": cpu_flags(), "command": command_line(), "work": str(work),
            "dataset": raw.name, "model": str(folder), "images": n, "tta": args.tta, "npp": args.npp,
            "nps": args.nps, "repeats": args.repeats, "warmup": args.warmup,
            "training": {"iterations": args.iterations, "iterations_per_epoch": args.iterations_per_epoch,
                         "batch": args.batch, "size": args.size},
            "timings": stats, "speed": speed, "agreement": agree,
            "load_average_after": [round(v, 2) for v in os.getloadavg()]}


def _markdown(payload: dict) -> str:
    s, a, cpu = payload["speed"], payload["agreement"], payload["cpu"]
    t = payload["training"]
    out = [f"Trained Med-DisSeg ({payload['dataset']}, {t['size']}x{t['size']}, {t['iterations']} training "
           f"iterations, batch {t['batch']}) predicting {payload['images']} test images through `nnUNetv2_predict "
           f"-device cpu` (TTA {payload['tta']}, `-npp {payload['npp']} -nps {payload['nps']}`), fp32 vs "
           f"`{ENV}=1` (bf16 autocast). {payload['warmup']} warm-up + {payload['repeats']} timed rounds, "
           f"alternating; medians. CPU: {cpu['model']}; bf16-relevant flags: "
           f"{', '.join(cpu['bf16_flags']) or 'none'}. Load average after the run: {payload['load_average_after']}.",
           "", "Speed (seconds; whole `nnUNetv2_predict` processes):", ""]
    rows = [[c, f"{s[c]['run_s']:.2f}", f"{s[c]['per_image_s']:.3f}", f"{s[c]['one_image_run_s']:.2f}",
             f"{s[c]['marginal_per_image_s']:.3f}", f"**{s[c]['images_per_s_after_startup']:.2f}**",
             f"{s[c]['startup_s']:.2f}"] for c in CANDIDATES]
    rows.append(["fp32 / bf16 time", "", f"{s['speedup_per_image']:.2f}x", "", "",
                 f"**{s['speedup_after_startup']:.2f}x**", ""])
    out.append(markdown_table(["candidate", f"{payload['images']}-image run", "per image (run / N)", "1-image run",
                               "marginal per image", "images/s after start-up", "start-up"], rows))
    d, tp = a["dice_fp32_vs_bf16"], a["test_percent"]
    out += ["", f"Agreement on the {a['images']} test images: Dice(fp32 mask, bf16 mask) mean {d['mean']:.4f}, "
            f"median {d['median']:.4f}, min {d['min']:.4f}; identical masks {d['identical_masks']} of {a['images']}; "
            f"pixels differing {100 * a['pixels_differing_fraction']:.3f} %.", "",
            markdown_table(["candidate", "test mIoU %", "test mDSC %"],
                           [[c, f"{tp[c]['iou']:.2f}", f"{tp[c]['dice']:.2f}"] for c in CANDIDATES]
                           + [["bf16 - fp32 (points)", f"{tp['bf16']['iou'] - tp['fp32']['iou']:+.2f}",
                               f"**{a['mdsc_change_points']:+.2f}**"]]),
            "", "marginal per image = (N-image run - 1-image run) / (N - 1); images/s after start-up = 1 / marginal "
            "per image; start-up = 1-image run - marginal per image.", "", "All runs (seconds):", "",
            markdown_table(["candidate", "median", "min", "max", "n"],
                           [[k, f"{v['median_s']:.2f}", f"{v['min_s']:.2f}", f"{v['max_s']:.2f}", v["n"]]
                            for k, v in payload["timings"].items()])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
