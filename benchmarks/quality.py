"""Budgeted quality study on Kvasir-SEG: default nnU-Net, nnU-Net + dispersive loss and Med-DisSeg
(and its recipe variants), several seeds each, all through nnU-Net's own commands.

Every run trains ``--epochs E`` epochs; the budgets (``--budget``, repeatable) set the iterations per epoch:

- ``iterations:N``: every method N iterations at the same ``--batch`` (plans copies with that batch);
- ``images:N``: **the same training images**, each method at its own plans' batch (nnU-Net's
  ``nnUNetPlans``, ``nnUNetv2_meddisseg_plan``'s default plans): ``ceil(N / (batch * E))`` per epoch;
- ``minutes:M``: **the same training minutes**, each at its plans' batch, from the method's equal-images
  run on the same device (epoch durations above their median count as one-off overhead, e.g.
  compilation; the rest scales with the iterations); the table reports the minutes each run trained.

Kvasir-SEG is converted at ``--size`` with the shipped split (792 train / 88 validation = nnU-Net fold 0 /
120 test) and preprocessed once per ``--work`` folder; each (method, seed) is a run of
``ablation.runs.AblationRun`` (the runner of ``nnUNetv2_meddisseg_ablate``: ``nnUNetv2_train`` with
``nnUNet_meddisseg_seed``, ``nnUNetv2_predict`` on the test images, the paper's metrics). The tables are
described in ``benchmarks/README.md``.

**In pieces.** ``--piece-min P`` stops the command after P minutes: a training still running is stopped
(its last epoch's checkpoint stays) and resumes with ``--c`` when the same command runs again
(``--deadline-min M`` only stops starting runs); a checkpoint is written every epoch. The results file
accumulates: each command adds its finished runs to ``<name>.json`` (from any work folder or machine,
same settings) and rewrites the tables, which state the seeds and images per method so far
(``"complete": false`` while runs are missing). ``--next-seed`` runs only the lowest seed of each method and
budget that the results file does not hold yet: with an images budget sized to the device's epoch times, each
command finishes one seed of every method, also on machines that keep nothing between commands.

**Pretrained arms** (``meddisseg_pretrained``, ``default_pretrained``): once per (arm, seed), before the arm's first
run of that seed, ``nnUNetv2_meddisseg_pretrain`` pretrains the network of the arm's plans at ``--batch`` on the
fold's training cases, seeded with the run's seed (``--pretrain-epochs`` x ``--pretrain-iterations-per-epoch``
batches; ``WORK/pretraining/``, resumed from its checkpoint after an interruption). Med-DisSeg then trains on plans
written by ``nnUNetv2_meddisseg_plan --encoder_weights FILE`` (one per seed), nnU-Net's default network with
``nnUNetv2_train ... -pretrained_weights FILE``; everything else as the arm from scratch. Each run records the
pretraining's minutes (``pretrain_minutes``, its epoch durations) beside the fine-tuning's. The results file then
holds ``arms`` (``quality_study.pretraining_arms``) for each budget with pretrained arms, each compared with its
network from scratch at equal total minutes where the file has that run (``quality_study.add_equal_minutes``: a
later command with ``--budget iterations:N`` and the scratch arms, N as the table says, extends the same file).

No ImageNet weights unless ``--encoder-weights`` (passed to ``nnUNetv2_meddisseg_plan``). torch.compile as
nnU-Net decides (on by default on CUDA) unless ``--no-compile``. The study's arms, one run and the tables:
``quality_study``; the budgets: ``quality_budgets``.
"""
import argparse
import json
import math
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Container, Dict, List, Optional, Sequence, Tuple

from common import DEFAULT_OUT, command_line, dataset_folder, machine_info, write_kvasir_split, write_results
from quality_budgets import Budget, iterations_per_epoch, parse_budget
from quality_study import (
    BASELINE,
    MEDDISSEG_PLANS,
    METHODS,
    Study,
    add_equal_minutes,
    aggregate,
    markdown,
    pretraining_arms,
)

from nnunetv2_meddisseg.ablation.runs import AblationRun, Variant, write_budget_plans
from nnunetv2_meddisseg.environment import (
    DATA_AUGMENTATION_PROCESSES_VARIABLE,
    planning_environment,
    set_nnunet_environment,
)
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import write_atomically
from nnunetv2_meddisseg.logged_command import CommandStopped, run_logged
from nnunetv2_meddisseg.pretraining.pretrain import checkpoint_path
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe

DATASET_ID = 502
CONFIGURATION = "2d"
FOLD = "0"
DATA_VARIABLE = "NNUNETV2_MEDDISSEG_TEST_DATA"


# ------------------------------------------------------------------------------------------------
# the benchmark


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = os.environ.get(DATA_VARIABLE)
    p.add_argument("--kvasir", default=str(Path(data) / "Kvasir-SEG") if data else None,
                   help=f"Kvasir-SEG folder (images/, masks/), read only (default: ${DATA_VARIABLE}/Kvasir-SEG)")
    p.add_argument("--size", type=int, default=64, help="images resized to SIZE x SIZE (paper: 256)")
    p.add_argument("--budget", type=parse_budget, action="append", default=None,
                   metavar="iterations:N|images:N|minutes:M",
                   help="the budget of every run (repeatable; default iterations:2000)")
    p.add_argument("--epochs", type=int, default=40, help="epochs per run (Med-DisSeg's Stage I: the first quarter)")
    p.add_argument("--iterations", type=int, default=None, help="shorthand for --budget iterations:N")
    p.add_argument("--iterations-per-epoch", type=int, default=None,
                   help="with --iterations N: --epochs N / ITERATIONS_PER_EPOCH")
    p.add_argument("--batch", type=int, default=4, help="batch size of every method for iterations:N (paper: 4)")
    p.add_argument("--val-iterations", type=int, default=5,
                   help="validation batches per epoch (nnU-Net's online pseudo Dice; nnU-Net's default is 50)")
    p.add_argument("--validation-only", action="store_true",
                   help="choose among arms: no test prediction; the tables compare the validation cases' Dice")
    p.add_argument("--no-final-validation", action="store_true",
                   help="skip nnU-Net's final validation of the fold-0 validation cases (no validation scores)")
    p.add_argument("--methods", nargs="+", default=["default", "meddisseg", "dispersive"], choices=list(METHODS),
                   help="methods to train")
    p.add_argument("--baseline", default=BASELINE, choices=list(METHODS),
                   help="the method every other one is compared to (paired test)")
    p.add_argument("--seeds", type=int, default=1, help="runs per method and budget (seeds S .. S+N-1)")
    p.add_argument("--first-seed", type=int, default=0, help="S, the first seed")
    p.add_argument("--next-seed", action="store_true",
                   help="run only the lowest seed of each method and budget that the results file does not hold yet "
                        "(one seed per command; repeat the command until the table is complete)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument("--piece-min", type=float, default=None,
                   help="stop after this many minutes; a training still running then resumes with --c when the "
                        "same command runs again")
    p.add_argument("--deadline-min", type=float, default=None,
                   help="start no run after this many minutes (runs already started finish)")
    p.add_argument("--disable-tta", action="store_true",
                   help="predict the test images without nnU-Net's mirroring (4x faster on a CPU)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--no-compile", action="store_true",
                   help="nnUNet_compile=f (default: as nnU-Net decides, compiled on CUDA)")
    p.add_argument("--encoder-weights", default=None,
                   help="passed to nnUNetv2_meddisseg_plan --encoder_weights (default: random initialisation)")
    p.add_argument("--pretrain-epochs", type=int, default=4,
                   help="pretrained arms: epochs of nnUNetv2_meddisseg_pretrain (default: half the CPU budget's 160 "
                        "fine-tuning iterations, see benchmarks/README.md)")
    p.add_argument("--pretrain-iterations-per-epoch", type=int, default=20,
                   help="pretrained arms: batches (at --batch) per pretraining epoch")
    p.add_argument("--work", default=None,
                   help="folder for the nnU-Net folders, models, predictions and logs (default: a new temporary "
                        "folder, kept); a rerun with the same folder reuses data and finished runs")
    p.add_argument("--dataset-id", type=int, default=DATASET_ID)
    p.add_argument("--num-processes", type=int, default=min(8, os.cpu_count() or 1),
                   help="processes for conversion and preprocessing")
    p.add_argument("--da-processes", type=int, default=None,
                   help="nnUNet_n_proc_DA per training run (default: 2 on CPU, nnU-Net's choice on CUDA)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the training processes (default: nnUNetv2_train's choice)")
    p.add_argument("--max-train-cases", type=int, default=None, help="debugging: only the first N training cases")
    p.add_argument("--max-test-cases", type=int, default=None, help="debugging: only the first N test cases")
    p.add_argument("--name", default="quality", help="results file name (NAME.json / NAME.md), extended by each run")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the results files")
    return p


def _check_args(args) -> Path:
    def fail(message: str) -> None:
        raise SystemExit(f"quality.py: error: {message}")

    if args.kvasir is None:
        fail(f"--kvasir is required (or set {DATA_VARIABLE} to the folder holding Kvasir-SEG/)")
    if args.validation_only and args.no_final_validation:
        fail("--validation-only needs nnU-Net's final validation: leave out --no-final-validation")
    if args.baseline not in args.methods:
        fail(f"--baseline {args.baseline} is not among --methods {' '.join(args.methods)}")
    if args.size < 32 or args.size % 16:
        fail(f"--size must be a multiple of 16 and at least 32, got {args.size}")
    if args.batch < 2:
        fail(f"--batch must be at least 2 (the dispersive loss needs pairs), got {args.batch}")
    if args.iterations is not None:
        per_epoch = args.iterations_per_epoch or args.iterations // args.epochs
        if args.iterations < 1 or per_epoch < 1 or args.iterations % per_epoch:
            fail(f"--iterations ({args.iterations}) must be a positive multiple of --iterations-per-epoch "
                 f"({per_epoch})")
        args.budget = [*(args.budget or []), Budget("iterations", args.iterations)]
        args.epochs = args.iterations // per_epoch
    elif args.iterations_per_epoch is not None:
        fail("--iterations-per-epoch needs --iterations")
    args.budget = [b._replace(batch=args.batch) if b.kind == "iterations" else b
                   for b in args.budget or [Budget("iterations", 2000)]]
    if args.epochs < 4:
        fail(f"--epochs must be at least 4 (Med-DisSeg's Stage I is the first quarter), got {args.epochs}")
    for b in args.budget:
        if b.kind == "iterations" and b.amount % args.epochs:
            fail(f"--budget iterations:{b.amount:g} must be a multiple of --epochs ({args.epochs})")
    for name in ("piece_min", "deadline_min"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            fail(f"--{name.replace('_', '-')} must be a number of minutes above 0, got {value}")
    if any(METHODS[k].pretrained for k in args.methods):
        if args.encoder_weights:
            fail("--encoder-weights: the pretrained arms (" + " ".join(k for k in args.methods if METHODS[k].pretrained)
                 + ") take their encoder from the pretraining; run them without --encoder-weights")
        if args.pretrain_epochs < 1 or args.pretrain_iterations_per_epoch < 1:
            fail(f"--pretrain-epochs and --pretrain-iterations-per-epoch must be at least 1, got "
                 f"{args.pretrain_epochs} and {args.pretrain_iterations_per_epoch}")
    if args.first_seed < 0:
        fail(f"--first-seed must be at least 0, got {args.first_seed}")
    for name in ("seeds", "parallel", "threads", "max_train_cases", "max_test_cases"):
        value = getattr(args, name)
        if value is not None and value < (2 if name.startswith("max") else 1):
            fail(f"--{name.replace('_', '-')} is too small: {value}")
    kvasir = Path(args.kvasir).resolve()
    if not (kvasir / "images").is_dir() or not (kvasir / "masks").is_dir():
        fail(f"--kvasir {kvasir}: expected a Kvasir-SEG folder with images/ and masks/")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            fail("--device cuda: CUDA is not available")
    return kvasir


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    kvasir = _check_args(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_quality_")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"work folder (kept): {work}")
    start = time.time()
    study = Study(start + 60 * args.deadline_min if args.deadline_min is not None else math.inf,
                  start + 60 * args.piece_min if args.piece_min is not None else math.inf, args.validation_only)
    payload = _run(args, kvasir, work, study, start)
    files = write_results(args.out, args.name, payload, markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']} (models, predictions and logs: {work})")
    return 0


def _prepare_data(args, kvasir: Path, env: Dict[str, str], work: Path) -> None:
    """Phases 1-2, skipped when ``work`` already holds the same preprocessed data."""
    stamp_file = work / "prepared.json"
    stamp = {"kvasir": str(kvasir), "size": args.size, "dataset_id": args.dataset_id,
             "max_train_cases": args.max_train_cases, "max_test_cases": args.max_test_cases}
    dataset, logs = str(args.dataset_id), work / "logs"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        name = dataset_folder(env["nnUNet_raw"], str(args.dataset_id)).name
        if (Path(env["nnUNet_preprocessed"]) / name / "nnUNetPlans.json").is_file():
            print(f"[1-2/5] reusing the converted and preprocessed {name} in {work}")
            return
    stamp_file.unlink(missing_ok=True)
    print(f"[1/5] converting Kvasir-SEG ({kvasir}) at {args.size}x{args.size}")
    command = ["nnUNetv2_meddisseg_convert", "kvasir-seg", str(kvasir), "-d", dataset, "--resize", str(args.size),
               "--overwrite", "-np", str(args.num_processes)]
    if args.max_train_cases is not None or args.max_test_cases is not None:
        shipped = write_kvasir_split(work / "subset_split.json", (None, None, None), "")
        train = args.max_train_cases or len(shipped["train"])
        val = max(2, round(train * len(shipped["val"]) / len(shipped["train"])))
        split = write_kvasir_split(work / "subset_split.json", (train, val, args.max_test_cases),
                                   "subset of the shipped Kvasir-SEG split (benchmarks/quality.py --max-*-cases)")
        print(f"  debugging subset: {len(split['train'])} train / {len(split['val'])} val / {len(split['test'])} test")
        command += ["--split_file", str(work / "subset_split.json")]
    for old in Path(env["nnUNet_preprocessed"]).glob(f"Dataset{args.dataset_id:03d}_*"):
        shutil.rmtree(old)
    run_logged(command, env, logs / "convert.log")
    print("[2/5] nnU-Net planning and preprocessing (2d)")
    run_logged(["nnUNetv2_plan_and_preprocess", "-d", dataset, "-c", CONFIGURATION, "-np", str(args.num_processes)],
               planning_environment(env), logs / "plan_and_preprocess.log")
    write_atomically(stamp_file, lambda f: f.write_text(json.dumps(stamp, indent=1) + "\n"))


def _environment(args, work: Path) -> Dict[str, str]:
    """The runs' environment: this process's (AblationRun starts from os.environ) with the work folder's
    nnU-Net folders, data-augmentation processes and torch.compile as asked (``README.md``: OMP_WAIT_POLICY)."""
    env = set_nnunet_environment(os.environ, work)
    env.setdefault("nnUNet_def_n_proc", str(args.num_processes))
    if args.da_processes is not None:
        env[DATA_AUGMENTATION_PROCESSES_VARIABLE] = str(args.da_processes)
    elif args.device == "cpu":
        env.setdefault(DATA_AUGMENTATION_PROCESSES_VARIABLE, "2")
    if args.no_compile:
        env["nnUNet_compile"] = "f"
    if args.parallel > 1:  # runs side by side: OpenMP threads that spin would wait for each other's cores
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _previous_results(path: Path, settings: dict, pretraining: Optional[dict] = None) -> dict:
    """The results file this run extends (empty if none); refused if it was made with other settings. A command
    without pretrained arms may extend a pretraining study: ``pretraining`` (this command's pretraining settings)
    then has to match the file's."""
    if not path.is_file():
        return {}
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"quality.py: error: {path} is not valid JSON ({e}): restore it or choose another --name")
    if "pretraining" in previous.get("settings", {}) and pretraining is not None:
        settings.setdefault("pretraining", pretraining)
    differing = sorted(k for k in set(settings) | set(previous.get("settings", {}))
                       if previous.get("settings", {}).get(k) != settings.get(k))
    if differing:
        raise SystemExit(f"quality.py: error: {path} holds results made with other settings "
                         f"({', '.join(differing)}): use the same settings or another --name")
    return previous


class Plans:
    """The plans (and their batch) each method trains on under a budget; Med-DisSeg's written on first use."""

    def __init__(self, args, env: Dict[str, str], work: Path, preprocessed: Path):
        self.args, self.env, self.work, self.preprocessed = args, env, work, preprocessed

    def of(self, key: str, budget: Budget) -> Tuple[str, int]:
        family = METHODS[key].family
        stem = "nnUNetPlans" if family == "nnunet" else MEDDISSEG_PLANS[family][0]
        name = stem + (f"_bs{budget.batch}" if budget.batch else "")
        if not (self.preprocessed / f"{name}.json").is_file():
            if family == "nnunet":
                plans = json.loads((self.preprocessed / f"{stem}.json").read_text())
                plans["plans_name"], plans["configurations"][CONFIGURATION]["batch_size"] = name, budget.batch
                write_atomically(self.preprocessed / f"{name}.json",
                                 lambda f: f.write_text(json.dumps(plans, indent=4) + "\n"))
            else:
                command = ["nnUNetv2_meddisseg_plan", "-d", str(self.args.dataset_id), "--plans_name", name,
                           *MEDDISSEG_PLANS[family][1]]
                command += ["--batch_size", str(budget.batch)] if budget.batch else []
                command += ["--encoder_weights", self.args.encoder_weights] if self.args.encoder_weights else []
                run_logged(command, planning_environment(self.env), self.work / "logs" / f"{name}_plan.log")
        plans = json.loads((self.preprocessed / f"{name}.json").read_text())
        return name, int(plans["configurations"][CONFIGURATION]["batch_size"])


@dataclass
class PretrainedRun(AblationRun):
    """An ``AblationRun`` whose first training starts from ``pretrained_weights`` (``nnUNetv2_train
    -pretrained_weights FILE``; nnU-Net refuses the option with ``--c``, and a resumed run has the weights already)."""

    pretrained_weights: Optional[Path] = None

    def train(self, variant: str, seed: int, time_limit_s: Optional[float] = None) -> None:
        if self.pretrained_weights is None or self.state(variant, seed) != "new":
            return super().train(variant, seed, time_limit_s)
        spec = self.variants[variant]
        command = ["nnUNetv2_train", self.dataset_name, "2d", self.fold, "-tr", spec.trainer, "-p", spec.plans,
                   "-device", self.device, "-pretrained_weights", str(self.pretrained_weights)]
        self._command(command, seed, self.out / "logs" / f"{variant}_seed{seed}_train.log", time_limit_s)


class Pretraining:
    """The pretraining of each (pretrained arm, seed): ``nnUNetv2_meddisseg_pretrain`` on fold 0's training cases with
    the run's seed, written once to ``WORK/pretraining/<arm>_e<E>x<I>_bs<B>/seed_<s>.pth`` and shared by the arm's
    budgets; a stopped one resumes from its checkpoint."""

    def __init__(self, args, env: Dict[str, str], work: Path, plans: "Plans", lock: threading.Lock):
        self.args, self.env, self.work, self.plans, self.lock = args, env, work, plans, lock  # lock: the plans'
        self.locks: Dict[Tuple[str, int], threading.Lock] = {}

    def file(self, key: str, seed: int) -> Path:
        a = self.args
        return (self.work / "pretraining" / f"{key}_e{a.pretrain_epochs}x{a.pretrain_iterations_per_epoch}_bs{a.batch}"
                / f"seed_{seed}.pth")

    def weights(self, key: str, seed: int, time_limit_s: Optional[float], say=print) -> Tuple[Path, dict]:
        """The weights file of ``(key, seed)`` and its ``pretraining`` record, pretrained first where missing
        (``CommandStopped`` after ``time_limit_s`` seconds); ``say`` reports the start and the end."""
        import torch

        with self.lock:
            lock = self.locks.setdefault((key, seed), threading.Lock())
            plans_name, _ = self.plans.of(key, Budget("iterations", 1, self.args.batch))
        with lock:
            target = self.file(key, seed)
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                env = dict(self.env)
                if self.args.threads is not None:  # torch's intra-op threads, as --threads sets them for training
                    env["OMP_NUM_THREADS"] = str(self.args.threads)
                log = self.work / "logs" / f"pretrain_{key}_seed{seed}.log"
                a = self.args
                resuming = " (resuming from its checkpoint)" if checkpoint_path(target).is_file() else ""
                say(f"pretrain {key}_seed{seed}: {a.pretrain_epochs} x {a.pretrain_iterations_per_epoch} batches of "
                    f"{plans_name}{resuming}, log {log}")
                command = ["nnUNetv2_meddisseg_pretrain", "-d", str(self.args.dataset_id), "-c", CONFIGURATION,
                           "-p", plans_name, "-f", FOLD, "-o", str(target), "--epochs", str(self.args.pretrain_epochs),
                           "--iterations_per_epoch", str(self.args.pretrain_iterations_per_epoch), "--seed", str(seed),
                           "--device", self.args.device, "--no_progress", "--method", METHODS[key].pretraining]
                run_logged(command, env, log, echo=False, append=True, timeout_s=time_limit_s)
            record = torch.load(target, map_location="cpu", weights_only=True)["pretraining"]
            say(f"pretrained {key}_seed{seed}: {record['minutes']:.1f} min, {METHODS[key].pretraining} loss "
                f"{record['losses'][0]:.4f} -> {record['losses'][-1]:.4f}")
        return target, record

    def fine_tuning_plans(self, key: str, seed: int, budget: Budget, weights: Path) -> Tuple[str, int]:
        """Med-DisSeg arms: plans ``<the arm's plans>_pretrained_seed<s>`` with the pretrained encoder (written on first
        use); nnU-Net's arms: the arm's plans (the weights go to ``nnUNetv2_train``). The caller holds the lock."""
        name, batch = self.plans.of(key, budget)
        family = METHODS[key].family
        if family == "nnunet":
            return name, batch
        name += f"_pretrained_seed{seed}"
        if (self.plans.preprocessed / f"{name}.json").is_file():
            return name, batch
        command = ["nnUNetv2_meddisseg_plan", "-d", str(self.args.dataset_id), "--plans_name", name,
                   *MEDDISSEG_PLANS[family][1], "--encoder_weights", str(weights)]
        command += ["--batch_size", str(budget.batch)] if budget.batch else []
        run_logged(command, planning_environment(self.env), self.work / "logs" / f"{name}_plan.log")
        return name, batch


def _run(args, kvasir: Path, work: Path, study: Study, start: float) -> dict:
    env = _environment(args, work)
    _prepare_data(args, kvasir, env, work)
    raw = dataset_folder(env["nnUNet_raw"], str(args.dataset_id))
    preprocessed = Path(env["nnUNet_preprocessed"]) / raw.name
    splits = json.loads((preprocessed / "splits_final.json").read_text())[0]
    labels = {k: int(v) for k, v in json.loads((raw / "dataset.json").read_text())["labels"].items()}
    settings = {"dataset": raw.name, "size": args.size, "train_cases": len(splits["train"]),
                "val_cases": len(splits["val"]), "test_cases": len(list((raw / "labelsTs").glob("*.png"))),
                "subset": args.max_train_cases is not None or args.max_test_cases is not None, "epochs": args.epochs,
                "val_iterations_per_epoch": args.val_iterations, "final_validation": not args.no_final_validation,
                "test_time_augmentation": not args.disable_tta, "validation_only": args.validation_only,
                "encoder_weights": args.encoder_weights or "random initialisation (no ImageNet weights)"}
    pretraining_settings = {"epochs": args.pretrain_epochs, "batch": args.batch, "fold": FOLD,
                            "iterations_per_epoch": args.pretrain_iterations_per_epoch}
    if any(METHODS[k].pretrained for k in args.methods):
        settings["pretraining"] = pretraining_settings
    previous = _previous_results(Path(args.out) / f"{args.name}.json", settings, pretraining_settings)
    runs = {(r["budget"], r["method"], r["seed"]): r for r in previous.get("runs", [])}
    machine = machine_info(args.device)
    device_name = machine.get("gpu", machine["cpu"])
    budgets = {**previous.get("budgets", {}), **{b.label: b._asdict() for b in args.budget}}
    plans, pending, lock = Plans(args, env, work, preprocessed), [], threading.Lock()
    pretraining = Pretraining(args, env, work, plans, lock)
    order = [(b, k, seed) for seed in range(args.first_seed, args.first_seed + args.seeds) for b in args.budget
             for k in args.methods]
    chosen = selected_runs(order, runs, args.next_seed)
    pending += [f"{b.label} {k} seed {seed} (a later command: --next-seed runs one seed per command)"
                for b, k, seed in order if (b.label, k, seed) not in runs and (b, k, seed) not in chosen]
    print(f"[3/5] budgets {', '.join(b.label for b in args.budget)}, {args.epochs} epochs per run; "
          f"{sum(k in runs for k in ((b.label, m, s) for b, m, s in order))} of {len(order)} runs done before")

    def payload() -> dict:
        done = list(runs.values())
        with_pretraining = {r["budget"] for r in done if METHODS[r["method"]].pretrained}
        tables = {label: aggregate([r for r in done if r["budget"] == label],
                                   [k for k in METHODS if any(r["budget"] == label and r["method"] == k for r in done)],
                                   args.baseline) for label in budgets}
        arms = {label: pretraining_arms([r for r in done if r["budget"] == label], tables[label], args.baseline)
                for label in budgets if label in with_pretraining}
        add_equal_minutes(arms, done, budgets, args.epochs)
        # the command that started the results file; each piece names its own
        return {"machine": machine, "command": previous.get("command", command_line()), "settings": settings,
                "budgets": budgets, "baseline": args.baseline,
                "tables": tables,
                **({"arms": arms} if arms else {}),
                "pieces": [*previous.get("pieces", []), {"date": machine["date"], "command": command_line(),
                                                         "device_name": device_name,
                                                         "wall_s": time.time() - start,
                                                         "compile": env.get("nnUNet_compile", "nnU-Net's default")}],
                "pending": sorted(pending), "complete": all((b.label, k, s) in runs for b, k, s in order),
                "runs": done}

    def one(budget: Budget, key: str, seed: int) -> None:
        if (budget.label, key, seed) in runs:
            return
        what = f"{budget.label} {key} seed {seed}"
        out = work / f"runs_{budget.label}_e{args.epochs}" / key
        try:
            with lock:
                plans_name, batch = plans.of(key, budget)
                settings = _budget(args, budget, key, batch, out, list(runs.values()), device_name)
        except UserError as e:
            pending.append(f"{what} ({e})")
            return
        if settings is None:
            pending.append(f"{what} (waits for {key}'s equal-images run on {device_name})")
            return
        weights, record = None, None
        if METHODS[key].pretrained:
            if not study.may_start():
                pending.append(f"{what} (not started (deadline))")
                return
            began = time.monotonic()
            try:
                weights, record = pretraining.weights(key, seed, study.remaining(), study._say)
                with lock:
                    plans_name, batch = pretraining.fine_tuning_plans(key, seed, budget, weights)
            except CommandStopped:
                pending.append(f"{what} (pretraining stopped at the end of the piece: the same command continues it)")
                return
            except UserError as e:
                pending.append(f"{what} (pretraining failed: {e})")
                return
            pretrain_wall_s = time.monotonic() - began
        with lock:
            plans_name = write_budget_plans(preprocessed, plans_name, settings)
        runner = PretrainedRun(out, raw.name, FOLD, {key: Variant(METHODS[key].trainer, plans_name)}, args.device,
                               raw / "imagesTs", raw / "labelsTs", labels, args.disable_tta, predict_processes=1,
                               pretrained_weights=weights if METHODS[key].family == "nnunet" else None)
        result = study.run(runner, key, seed)
        if result["status"] != "done":
            pending.append(f"{what} ({result['status']})")
            return
        iterations = settings["iterations_per_epoch"]
        result.update(budget=budget.label, batch=batch, iterations_per_epoch=iterations,
                      iterations=args.epochs * iterations, images_seen=args.epochs * iterations * batch,
                      device_name=device_name)
        if record is not None:
            result.update(pretrain_minutes=record["minutes"], finetune_minutes=result["train_wall_s"] / 60,
                          pretraining={"file": str(weights), "wall_s_this_command": pretrain_wall_s,
                                       **{k: record[k] for k in ("seed", "cases", "fold", "validation_cases_used",
                                                                 "split", "epochs", "iterations_per_epoch",
                                                                 "batch_size", "patch_size", "losses", "minutes",
                                                                 "plans", "network")}})
        with lock:
            runs[(budget.label, key, seed)] = result
            current = payload()
            write_results(args.out, args.name, current, markdown(current))

    print(f"[4/5] {len(chosen)} runs, {args.parallel} at a time")
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        list(pool.map(lambda item: one(*item), chosen))
    print("[5/5] results" + (f" ({len(pending)} runs still to do: run the command again)" if pending else ""))
    return payload()


def selected_runs(order: Sequence[Tuple[Budget, str, int]], done: Container[Tuple[str, str, int]],
                  next_seed: bool) -> List[Tuple[Budget, str, int]]:
    """The (budget, method, seed) of ``order`` this command runs: every one whose ``(budget label, method, seed)``
    is not ``done`` yet, or with ``next_seed`` only the lowest such seed of each budget and method (one seed per
    command, so that a command stays short and each one adds a seed to every arm)."""
    missing = [(b, k, seed) for b, k, seed in order if (b.label, k, seed) not in done]
    if not next_seed:
        return missing
    lowest: Dict[Tuple[str, str], int] = {}
    for b, k, seed in missing:
        lowest[(b.label, k)] = min(seed, lowest.get((b.label, k), seed))
    return [(b, k, seed) for b, k, seed in missing if lowest[(b.label, k)] == seed]


def _budget(args, budget: Budget, key: str, batch: int, out: Path, runs: List[dict], device_name: str
            ) -> Optional[dict]:
    """The recipe settings of ``key``'s runs of ``budget`` (``write_budget_plans`` puts them into their plans), fixed
    in ``out/budget.json`` when first chosen; None while an equal-minutes budget has no calibration run yet."""
    if (out / "budget.json").is_file():
        return json.loads((out / "budget.json").read_text())
    calibration = None
    if budget.kind == "minutes":
        calibration = next((r for r in runs if r["method"] == key and r["budget"].startswith("images")
                            and r["device_name"] == device_name and r.get("epoch_seconds")), None)
        if calibration is None:
            return None
    iterations = iterations_per_epoch(budget, args.epochs, batch, calibration)
    recipe = ScheduleRecipe(num_epochs=args.epochs, iterations_per_epoch=iterations,
                            val_iterations_per_epoch=args.val_iterations, save_every=1,
                            final_validation=not args.no_final_validation, torch_threads=args.threads)
    settings = {k: v for k, v in vars(recipe).items() if v is not None}
    out.mkdir(parents=True, exist_ok=True)
    (out / "budget.json").write_text(json.dumps(settings) + "\n")
    return settings


if __name__ == "__main__":
    raise SystemExit(main())
