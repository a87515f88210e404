"""Budgeted quality comparison on Kvasir-SEG: default nnU-Net vs Med-DisSeg vs nnU-Net + dispersive loss.

The three methods are trained through nnU-Net's own commands for the same budget: the same number
of training iterations (``--iterations``, in epochs of ``--iterations-per-epoch``) and the same batch
size (``--batch``), on the same data, then evaluated on Kvasir-SEG's 120 test images with the
paper's metrics (mIoU, mDSC, Recall, Precision) by ``nnUNetv2_meddisseg_compare``.

Phases (each subprocess writes a log file under ``WORK/logs``):

1. ``nnUNetv2_meddisseg_convert kvasir-seg KVASIR -d ID --resize SIZE``: the shipped seeded split,
   792 train / 88 validation (nnU-Net fold 0) / 120 test. Read from ``--kvasir``, written to
   ``WORK/nnUNet_raw``; nothing is copied into the repository.
2. ``nnUNetv2_plan_and_preprocess -d ID -c 2d``. Reused on a rerun with the same work folder, data
   and size.
3. Plans with the budget's batch size: ``nnUNetPlans_bs<B>`` (a copy of nnUNetPlans with
   ``configurations['2d']['batch_size'] = B``) and ``nnUNetv2_meddisseg_plan --batch-size B
   --plans-name nnUNetMedDisSegPlans_bs<B>``. A generated module ``WORK/trainers/
   meddisseg_budget_trainers.py`` (put first in ``nnUNet_extTrainer``, next to this package's
   folder) subclasses the three trainers with the budget's schedule: ``nnUNetTrainer_budget``
   (nnUNetPlans_bs<B>), ``nnUNetTrainerMedDisSeg_budget`` (nnUNetMedDisSegPlans_bs<B>; Stage I is
   the first ``floor(0.25 * epochs)`` epochs, as the trainer splits any schedule; each Stage I
   iteration sees its batch twice, clean and photometrically perturbed) and
   ``nnUNetTrainerDispersive_budget`` (nnUNetPlans_bs<B>). Each validates ``--val-iterations``
   batches per epoch (nnU-Net's online pseudo Dice only) and skips nnU-Net's final validation of
   the 88 fold-0 cases unless ``--final-validation``: the test set is what is compared.
4. ``nnUNetv2_train ID 2d 0 -tr <trainer> -p <plans> -device DEVICE`` for each method; the wall
   time of the command and the sum of nnU-Net's logged epoch times are recorded.
5. ``nnUNetv2_meddisseg_compare``: default nnU-Net vs Med-DisSeg, and default nnU-Net vs nnU-Net +
   dispersive (the baseline's test predictions are reused), each with a Wilcoxon signed-rank test.
6. One table (``quality.json`` / ``.md``) with the paper's Kvasir-SEG numbers as a reference row.

No ImageNet weights: none can be downloaded here, so Med-DisSeg's ResNet-50 encoder starts from
random initialisation (the paper starts from ImageNet weights); ``--encoder-weights FILE`` (a local
torchvision ResNet-50 state dict, passed to ``nnUNetv2_meddisseg_plan``) changes that.

On a shared CPU ``--threads 1`` is much faster than nnUNetv2_train's default of one torch thread
per core (measured: Med-DisSeg's Stage II step about 4x faster at 64x64 on 2 busy cores).

Paper protocol on a GPU: ``--device cuda --size 256 --batch 4`` (and as many iterations as the
time allows; nnU-Net compiles the networks with torch.compile on CUDA unless ``nnUNet_compile=f``).

Usage: ``python benchmarks/quality.py [--kvasir PATH] [--size 64] [--iterations N]
[--iterations-per-epoch N] [--batch 4] [--device cpu|cuda] [--work DIR]``
"""
import argparse
import csv
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from common import (DEFAULT_OUT, command_line, machine_info, markdown_table, nnunet_environment, run_logged,
                    write_results)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KVASIR = REPO_ROOT.parent / "shared" / "data" / "Kvasir-SEG"
DATASET_ID = 502
CONFIGURATION = "2d"
FOLD = "0"
TRAINER_MODULE = "meddisseg_budget_trainers"
METRICS = ("iou", "dice", "recall", "precision")
METRIC_TITLES = {"iou": "mIoU", "dice": "mDSC", "recall": "Recall", "precision": "Precision"}
NO_IMAGENET = "no ImageNet weights: the ResNet-50 encoder starts from random initialisation"

#: key -> (row name, budget trainer, base trainer (module, class), plans family)
METHODS = {
    "default": ("nnU-Net (default)", "nnUNetTrainer_budget",
                ("nnunetv2.training.nnUNetTrainer.nnUNetTrainer", "nnUNetTrainer"), "nnunet"),
    "meddisseg": ("Med-DisSeg", "nnUNetTrainerMedDisSeg_budget",
                  ("nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg", "nnUNetTrainerMedDisSeg"), "meddisseg"),
    "dispersive": ("nnU-Net + dispersive", "nnUNetTrainerDispersive_budget",
                   ("nnunetv2_meddisseg.training.variants", "nnUNetTrainerDispersive"), "nnunet"),
}

_TRAINER_TEMPLATE = '''"""Trainers with the budget of benchmarks/quality.py: generated, rewritten by every run.

{num_epochs} epochs x {iterations_per_epoch} iterations = {iterations} training iterations.
Validation iterations per epoch: {val_iterations}; nnU-Net's final validation {final_validation_text}.
"""
import torch
{imports}

NUM_EPOCHS = {num_epochs}
ITERATIONS_PER_EPOCH = {iterations_per_epoch}
VAL_ITERATIONS_PER_EPOCH = {val_iterations}
FINAL_VALIDATION = {final_validation}
TORCH_THREADS = {threads}  # None: nnUNetv2_train's choice (all cores on CPU)


def _budget(trainer) -> None:
    trainer.num_epochs = NUM_EPOCHS
    trainer.num_iterations_per_epoch = ITERATIONS_PER_EPOCH
    trainer.num_val_iterations_per_epoch = VAL_ITERATIONS_PER_EPOCH
    if TORCH_THREADS is not None:
        torch.set_num_threads(TORCH_THREADS)
{classes}'''

_CLASS_TEMPLATE = '''

class {name}({base}):
    """{base} for {num_epochs} epochs x {iterations_per_epoch} iterations."""

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        _budget(self)

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        if FINAL_VALIDATION:
            super().perform_actual_validation(save_probabilities)
        else:
            self.print_to_log_file("final validation skipped (benchmarks/quality.py: the test set is compared)")
'''


# ------------------------------------------------------------------------------------------------
# preparation


def write_budget_trainers(folder: Path, num_epochs: int, iterations_per_epoch: int, val_iterations: int,
                          final_validation: bool, threads: Optional[int] = None) -> Path:
    """Write ``folder/meddisseg_budget_trainers.py`` with the three budget trainers; returns its path.

    threads: ``torch.set_num_threads`` in each trainer's constructor (after nnUNetv2_train's own
    setting), or None to keep nnUNetv2_train's choice.
    """
    values = {"num_epochs": num_epochs, "iterations_per_epoch": iterations_per_epoch, "threads": threads,
              "iterations": num_epochs * iterations_per_epoch, "val_iterations": val_iterations,
              "final_validation": final_validation,
              "final_validation_text": "runs" if final_validation else "is skipped"}
    imports = sorted({f"from {module} import {cls}" for _, _, (module, cls), _ in METHODS.values()})
    classes = "".join(_CLASS_TEMPLATE.format(name=trainer, base=cls, **values)
                      for _, trainer, (_, cls), _ in METHODS.values())
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{TRAINER_MODULE}.py"
    target.write_text(_TRAINER_TEMPLATE.format(imports="\n".join(imports), classes=classes, **values))
    return target


def write_batch_plans(preprocessed: Path, source_name: str, target_name: str, batch: int) -> Path:
    """``target_name.json``: a copy of ``source_name.json`` whose 2d configuration has ``batch_size = batch``."""
    plans = json.loads((preprocessed / f"{source_name}.json").read_text())
    if CONFIGURATION not in plans.get("configurations", {}):
        raise SystemExit(f"{preprocessed / source_name}.json has no '{CONFIGURATION}' configuration")
    plans["plans_name"] = target_name
    plans["configurations"][CONFIGURATION]["batch_size"] = batch
    target = preprocessed / f"{target_name}.json"
    target.write_text(json.dumps(plans, indent=4) + "\n")
    return target


def write_subset_split(target: Path, max_train: Optional[int], max_test: Optional[int]) -> dict:
    """A ``--split-file`` with the first cases of the shipped Kvasir-SEG lists (debugging runs)."""
    import nnunetv2_meddisseg.datasets as datasets

    shipped = json.loads((Path(datasets.__file__).parent / "splits" / "kvasir_seg.json").read_text())
    train, val, test = shipped["train"], shipped["val"], shipped["test"]
    if max_train is not None:
        val = val[:max(2, round(max_train * len(val) / len(train)))]
        train = train[:max_train]
    if max_test is not None:
        test = test[:max_test]
    split = {"description": "subset of the shipped Kvasir-SEG split (benchmarks/quality.py --max-*-cases)",
             "train": train, "val": val, "test": test}
    target.write_text(json.dumps(split, indent=1) + "\n")
    return split


def _dataset_folder(root: str, dataset_id: int) -> Path:
    found = sorted(Path(root).glob(f"Dataset{dataset_id:03d}_*"))
    if len(found) != 1:
        raise SystemExit(f"expected one Dataset{dataset_id:03d}_* folder in {root}, found {len(found)}")
    return found[0]


def _epoch_times(log_file: Path) -> List[float]:
    """nnU-Net's 'Epoch time: X s' lines of a training log, in order."""
    return [float(m) for m in re.findall(r"Epoch time: ([0-9.]+) s", log_file.read_text(errors="replace"))]


def _read_comparison(folder: Path) -> Dict[str, dict]:
    """``{method: {metric: mean %, metric_std: std %, source, n_cases}}`` from ``comparison.csv``."""
    rows = {}
    with open(folder / "comparison.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            rows[r["method"]] = {k: (float(v) if v not in ("", None) and k not in ("method", "source") else v)
                                 for k, v in r.items()}
    return rows


# ------------------------------------------------------------------------------------------------
# the benchmark


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kvasir", default=str(DEFAULT_KVASIR), help="Kvasir-SEG folder (images/, masks/); read only")
    p.add_argument("--size", type=int, default=64, help="images resized to SIZE x SIZE (paper: 256)")
    p.add_argument("--iterations", type=int, default=2000, help="training iterations per method (the budget)")
    p.add_argument("--iterations-per-epoch", type=int, default=50,
                   help="iterations per nnU-Net epoch (epochs = iterations / this; Med-DisSeg's Stage I is the first "
                        "quarter of the epochs)")
    p.add_argument("--batch", type=int, default=4, help="batch size of all three methods (paper: 4)")
    p.add_argument("--val-iterations", type=int, default=5,
                   help="validation batches per epoch (nnU-Net's online pseudo Dice; nnU-Net's default is 50)")
    p.add_argument("--final-validation", action="store_true",
                   help="run nnU-Net's final validation of the fold-0 validation cases after training")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--encoder-weights", default=None,
                   help="local torchvision ResNet-50 state dict for Med-DisSeg's encoder (default: random "
                        "initialisation; nothing is downloaded)")
    p.add_argument("--work", default=None,
                   help="folder for the nnU-Net folders, models, predictions and logs (default: a new temporary "
                        "folder, kept); a rerun with the same folder reuses the converted and preprocessed data")
    p.add_argument("--dataset-id", type=int, default=DATASET_ID)
    p.add_argument("--num-processes", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes for conversion and preprocessing")
    p.add_argument("--da-processes", type=int, default=None,
                   help="nnUNet_n_proc_DA for training (default: 2 on CPU, nnU-Net's choice on CUDA)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the training processes (default: nnUNetv2_train's choice, all cores on "
                        "CPU; on a shared CPU 1 is often much faster)")
    p.add_argument("--max-train-cases", type=int, default=None,
                   help="debugging: only the first N training cases of the split (default: all 792 + 88 validation)")
    p.add_argument("--max-test-cases", type=int, default=None,
                   help="debugging: only the first N test cases (default: all 120)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for quality.json / .md")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.size < 32 or args.size % 16:
        raise SystemExit(f"--size must be a multiple of 16 and at least 32, got {args.size}")
    if args.iterations < 1 or args.iterations_per_epoch < 1 or args.iterations % args.iterations_per_epoch:
        raise SystemExit(f"--iterations ({args.iterations}) must be a positive multiple of --iterations-per-epoch "
                         f"({args.iterations_per_epoch})")
    if args.batch < 2:
        raise SystemExit(f"--batch must be at least 2 (the dispersive loss needs pairs in a batch), got {args.batch}")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"--threads must be at least 1, got {args.threads}")
    for name in ("max_train_cases", "max_test_cases"):
        value = getattr(args, name)
        if value is not None and value < 2:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 2, got {value}")
    kvasir = Path(args.kvasir).resolve()
    if not (kvasir / "images").is_dir() or not (kvasir / "masks").is_dir():
        raise SystemExit(f"--kvasir {kvasir}: expected a Kvasir-SEG folder with images/ and masks/")
    if args.encoder_weights and not Path(args.encoder_weights).is_file():
        raise SystemExit(f"--encoder-weights {args.encoder_weights}: file not found")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available on this machine")

    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_quality_")).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"work folder (kept): {work}")
    start = time.time()
    payload = _run(args, kvasir, work, logs)
    payload["total_wall_s"] = time.time() - start
    files = write_results(args.out, "quality", payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']} (models, predictions, comparisons and logs: {work})")
    return 0


def _prepare_data(args, kvasir: Path, env: Dict[str, str], logs: Path, work: Path) -> dict:
    """Phases 1-2, skipped when ``work`` already holds the same preprocessed data."""
    stamp_file = work / "prepared.json"
    stamp = {"kvasir": str(kvasir), "size": args.size, "dataset_id": args.dataset_id,
             "max_train_cases": args.max_train_cases, "max_test_cases": args.max_test_cases}
    dataset = str(args.dataset_id)
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        name = _dataset_folder(env["nnUNet_raw"], args.dataset_id).name
        if (Path(env["nnUNet_preprocessed"]) / name / "nnUNetPlans.json").is_file():
            print(f"[1-2/6] reusing the converted and preprocessed {name} in {work} ({stamp_file})")
            return stamp
    stamp_file.unlink(missing_ok=True)
    print(f"[1/6] converting Kvasir-SEG ({kvasir}) at {args.size}x{args.size} -> {env['nnUNet_raw']}")
    command = ["nnUNetv2_meddisseg_convert", "kvasir-seg", str(kvasir), "-d", dataset, "--resize", str(args.size),
               "--overwrite", "-np", str(args.num_processes)]
    if args.max_train_cases is not None or args.max_test_cases is not None:
        split = write_subset_split(work / "subset_split.json", args.max_train_cases, args.max_test_cases)
        print(f"  debugging subset: {len(split['train'])} train / {len(split['val'])} val / {len(split['test'])} test")
        command += ["--split-file", str(work / "subset_split.json")]
    for old in Path(env["nnUNet_preprocessed"]).glob(f"Dataset{args.dataset_id:03d}_*"):
        shutil.rmtree(old)  # data of an earlier conversion
    run_logged(command, env, logs / "convert.log")
    print("[2/6] nnU-Net planning and preprocessing (2d)")
    run_logged(["nnUNetv2_plan_and_preprocess", "-d", dataset, "-c", CONFIGURATION, "-np", str(args.num_processes)],
               env, logs / "plan_and_preprocess.log")
    stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def _run(args, kvasir: Path, work: Path, logs: Path) -> dict:
    from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

    trainer_dir = work / "trainers"
    env = nnunet_environment(work, [str(trainer_dir)])
    env.setdefault("nnUNet_def_n_proc", str(args.num_processes))
    if args.da_processes is not None:
        env["nnUNet_n_proc_DA"] = str(args.da_processes)
    elif args.device == "cpu":
        env.setdefault("nnUNet_n_proc_DA", "2")
    dataset = str(args.dataset_id)
    _prepare_data(args, kvasir, env, logs, work)
    name = _dataset_folder(env["nnUNet_raw"], args.dataset_id).name
    raw = Path(env["nnUNet_raw"]) / name
    preprocessed = Path(env["nnUNet_preprocessed"]) / name
    splits = json.loads((preprocessed / "splits_final.json").read_text())[0]
    num_test = len([f for f in (raw / "labelsTs").iterdir() if f.name.endswith(".png")])

    epochs = args.iterations // args.iterations_per_epoch
    stage1_epochs = int(math.floor(nnUNetTrainerMedDisSeg.stage1_fraction * epochs))
    print(f"[3/6] budget: {args.iterations} iterations = {epochs} epochs x {args.iterations_per_epoch}, batch "
          f"{args.batch}; Med-DisSeg Stage I {stage1_epochs} epochs, Stage II {epochs - stage1_epochs}")
    if stage1_epochs == 0:
        print("  note: fewer than 4 epochs leave Med-DisSeg without a Stage I (its split is floor(epochs / 4))")
    trainer_file = write_budget_trainers(trainer_dir, epochs, args.iterations_per_epoch, args.val_iterations,
                                         args.final_validation, args.threads)
    print(f"  trainers: {trainer_file}")
    plans = {"nnunet": f"nnUNetPlans_bs{args.batch}", "meddisseg": f"nnUNetMedDisSegPlans_bs{args.batch}"}
    print(f"  plans: {write_batch_plans(preprocessed, 'nnUNetPlans', plans['nnunet'], args.batch)}")
    command = ["nnUNetv2_meddisseg_plan", "-d", dataset, "--batch-size", str(args.batch), "--plans-name",
               plans["meddisseg"]]
    if args.encoder_weights:
        command += ["--encoder-weights", str(Path(args.encoder_weights).resolve())]
    run_logged(command, env, logs / "meddisseg_plan.log")

    methods = {key: _train(key, i, dataset, plans, stage1_epochs, args, env, logs, preprocessed)
               for i, key in enumerate(METHODS)}
    print("[5/6] predicting and evaluating the test set")
    comparisons = _compare(methods, dataset, args.device, env, logs, work)

    print("[6/6] results")
    for key, m in methods.items():
        source = comparisons["meddisseg" if key != "dispersive" else "dispersive"]["table"][m["name"]]
        m["metrics_percent"] = {k: source[k] for k in METRICS}
        m["std_percent"] = {k: source[f"{k}_std"] for k in METRICS}
        m["n_test_cases"] = int(source["n_cases"])
        if key != "default":
            stats = comparisons[key]["statistics"]["metrics"]
            m["wilcoxon_vs_default"] = {k: {"p_value": stats[k]["p_value"], "mean_difference_percent":
                                            100 * stats[k]["mean_difference"], "better": stats[k]["n_better"],
                                            "worse": stats[k]["n_worse"]} for k in METRICS}
    paper = [dict(r, method=n) for n, r in comparisons["meddisseg"]["table"].items() if r["source"] != "this run"]
    weights = (f"encoder initialised from {Path(args.encoder_weights).resolve()}" if args.encoder_weights
               else NO_IMAGENET)
    return {"machine": machine_info(args.device), "command": command_line(), "dataset": name,
            "kvasir": str(kvasir), "work": str(work),
            "data": {"size": args.size, "train_cases": len(splits["train"]), "val_cases": len(splits["val"]),
                     "test_cases": num_test, "subset": args.max_train_cases is not None
                     or args.max_test_cases is not None},
            "budget": {"iterations": args.iterations, "iterations_per_epoch": args.iterations_per_epoch,
                       "epochs": epochs, "batch": args.batch, "val_iterations_per_epoch": args.val_iterations,
                       "final_validation": args.final_validation, "meddisseg_stage1_epochs": stage1_epochs,
                       "meddisseg_stage2_epochs": epochs - stage1_epochs},
            "device": args.device, "encoder_weights": weights, "training_torch_threads": args.threads,
            "environment": {k: env.get(k) for k in ("nnUNet_n_proc_DA", "nnUNet_def_n_proc", "nnUNet_compile")},
            "methods": methods, "paper_reference": paper[0] if paper else None,
            "comparisons": {k: c["folder"] for k, c in comparisons.items()}}


def _train(key: str, index: int, dataset: str, plans: Dict[str, str], stage1_epochs: int, args,
           env: Dict[str, str], logs: Path, preprocessed: Path) -> dict:
    """Phase 4 for one method: ``nnUNetv2_train``, its wall time and logged epoch times."""
    row_name, trainer, _, family = METHODS[key]
    print(f"[4/6] training {row_name} ({index + 1}/{len(METHODS)}): {trainer} on {plans[family]}")
    log_file = logs / f"train_{trainer}.log"
    wall = run_logged(["nnUNetv2_train", dataset, CONFIGURATION, FOLD, "-tr", trainer, "-p", plans[family],
                       "-device", args.device], env, log_file)
    epoch_times = _epoch_times(log_file)
    epochs = args.iterations // args.iterations_per_epoch
    if len(epoch_times) != epochs:
        print(f"  warning: found {len(epoch_times)} epoch times in {log_file}, expected {epochs}")
    config = json.loads((preprocessed / f"{plans[family]}.json").read_text())["configurations"][CONFIGURATION]
    result = {"name": row_name, "trainer": trainer, "plans": plans[family], "train_wall_s": wall,
              "epoch_times_s": epoch_times, "epochs_s": sum(epoch_times),
              "s_per_iteration": sum(epoch_times) / args.iterations if epoch_times else None,
              "patch_size": config["patch_size"], "batch_size": config["batch_size"],
              "network": config["architecture"]["network_class_name"].rsplit(".", 1)[-1], "log": str(log_file)}
    if key == "meddisseg" and len(epoch_times) == epochs:
        for stage, times in (("stage1", epoch_times[:stage1_epochs]), ("stage2", epoch_times[stage1_epochs:])):
            result[f"s_per_iteration_{stage}"] = (sum(times) / (len(times) * args.iterations_per_epoch)
                                                  if times else None)
    return result


def _compare(methods: Dict[str, dict], dataset: str, device: str, env: Dict[str, str], logs: Path,
             work: Path) -> Dict[str, dict]:
    """Phase 5: default vs Med-DisSeg, then default vs nnU-Net + dispersive (reusing the baseline's
    test predictions of the first comparison)."""
    comparisons = {}
    baseline = methods["default"]
    baseline_folder = f"{baseline['trainer']}__{baseline['plans']}__{CONFIGURATION}"
    for key in ("meddisseg", "dispersive"):
        m = methods[key]
        out = work / f"compare_{key}"
        if out.exists():
            shutil.rmtree(out)
        first = work / "compare_meddisseg" / "predictions" / baseline_folder
        if key != "meddisseg" and first.is_dir():
            shutil.copytree(first, out / "predictions" / baseline_folder)
        run_logged(["nnUNetv2_meddisseg_compare", "-d", dataset, "-f", FOLD, "-c", CONFIGURATION,
                    "--baseline-trainer", baseline["trainer"], "--baseline-plans", baseline["plans"],
                    "--trainer", m["trainer"], "--plans", m["plans"], "--device", device,
                    "--names", baseline["name"], m["name"], "-o", str(out)], env, logs / f"compare_{key}.log")
        comparisons[key] = {"folder": str(out), "table": _read_comparison(out),
                            "statistics": json.loads((out / "statistics.json").read_text())}
    return comparisons


def _fmt(v: Optional[float], digits: int = 1) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "–"


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")


def _markdown(payload: dict) -> str:
    b, d = payload["budget"], payload["data"]
    out = [f"Kvasir-SEG ({payload['dataset']}) resized to {d['size']}x{d['size']}: {d['train_cases']} training / "
           f"{d['val_cases']} validation (nnU-Net fold 0) / {d['test_cases']} test images"
           + (" (**debugging subset**, not the paper's protocol)" if d["subset"] else "") + f"; device "
           f"{payload['device']}. Budget for every method: **{b['iterations']} training iterations** ({b['epochs']} "
           f"epochs x {b['iterations_per_epoch']}), **batch {b['batch']}**; validation iterations per epoch: "
           f"{b['val_iterations_per_epoch']}; Med-DisSeg: Stage I {_epochs(b['meddisseg_stage1_epochs'])}, Stage II "
           f"{_epochs(b['meddisseg_stage2_epochs'])}. Torch threads per training process: "
           f"{payload.get('training_torch_threads') or 'nnUNetv2_train default (all cores on CPU)'}.", "",
           f"- **{payload['encoder_weights']}**" + (" (the paper starts from ImageNet weights; none can be "
                                                    "downloaded here)." if payload["encoder_weights"] == NO_IMAGENET
                                                    else "."),
           "- nnU-Net's networks (PlainConvUNet) start from random initialisation as always.",
           "- Metrics: mean over test images, percent (± standard deviation), computed by "
           "`nnUNetv2_meddisseg_compare`; p: two-sided Wilcoxon signed-rank test of the per-image differences to "
           "the default nnU-Net.", ""]
    rows = []
    for key, m in payload["methods"].items():
        cells = [f"{_fmt(m['metrics_percent'][k])} ± {_fmt(m['std_percent'][k])}" for k in METRICS]
        p = m.get("wilcoxon_vs_default", {}).get("dice", {}).get("p_value")
        rows.append([m["name"], f"{m['trainer']} / {m['plans']}", *cells,
                     "–" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}"),
                     f"{m['train_wall_s'] / 60:.1f}", _fmt(m["s_per_iteration"], 3), b["iterations"], m["batch_size"],
                     "x".join(map(str, m["patch_size"]))])
    ref = payload["paper_reference"]
    if ref:
        rows.append([f"{ref['method']}: ImageNet encoder, 256x256", "reference", *[_fmt(ref.get(k)) for k in METRICS],
                     "", "", "", "", "", ""])
    out.append(markdown_table(["method", "trainer / plans", *[f"{METRIC_TITLES[k]} %" for k in METRICS],
                               "p (mDSC)", "train wall min", "s / iteration", "iterations", "batch", "patch"], rows))
    md = payload["methods"].get("meddisseg", {})
    out += ["", "train wall = the whole `nnUNetv2_train` command (start-up, data loading, training, per-epoch "
            "validation" + ("" if b["final_validation"] else "; final validation skipped") + "); s / iteration = "
            "nnU-Net's logged epoch times (training + validation iterations) / iterations."]
    if md.get("s_per_iteration_stage1") is not None or md.get("s_per_iteration_stage2") is not None:
        out.append(f"Med-DisSeg s / iteration: Stage I {_fmt(md.get('s_per_iteration_stage1'), 3)} (clean + "
                   f"perturbed views, encoder only), Stage II {_fmt(md.get('s_per_iteration_stage2'), 3)}.")
    out += ["", f"Comparison folders (tables, bar charts, paired differences, overlays): "
            + ", ".join(f"`{v}`" for v in payload["comparisons"].values()) + f". Total time "
            f"{payload['total_wall_s'] / 60:.1f} min." if "total_wall_s" in payload else ""]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
