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

No ImageNet weights unless ``--encoder-weights`` (passed to ``nnUNetv2_meddisseg_plan``). torch.compile as
nnU-Net decides (on by default on CUDA) unless ``--no-compile``.
"""
import argparse
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Container, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
from common import DEFAULT_OUT, command_line, machine_info, markdown_table, write_results

from nnunetv2_meddisseg.ablation.runs import AblationRun, Variant, write_budget
from nnunetv2_meddisseg.ablation.table import BINARY_METRICS as METRICS
from nnunetv2_meddisseg.ablation.table import METRIC_TITLES
from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.environment import (
    DATA_AUGMENTATION_PROCESSES_VARIABLE,
    planning_environment,
    set_nnunet_environment,
)
from nnunetv2_meddisseg.evaluation.paired_statistics import wilcoxon_p_value
from nnunetv2_meddisseg.logged_command import CommandStopped, run_logged
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe

DATASET_ID = 502
CONFIGURATION = "2d"
FOLD = "0"
DATA_VARIABLE = "NNUNETV2_MEDDISSEG_TEST_DATA"


class Method(NamedTuple):
    name: str
    trainer: str
    family: str  # "nnunet" (nnU-Net's plans and network) or a key of MEDDISSEG_PLANS


#: Med-DisSeg plans families: plans name stem -> extra ``nnUNetv2_meddisseg_plan`` arguments
MEDDISSEG_PLANS: Dict[str, tuple] = {
    "meddisseg": ("nnUNetMedDisSegPlans", ()),
    "meddisseg_relu": ("nnUNetMedDisSegPlans_relu", ("--activation", "relu")),
}


METHODS: Dict[str, Method] = {
    "default": Method("nnU-Net (default)", "nnUNetTrainerBaseline", "nnunet"),
    "dispersive": Method("nnU-Net + dispersive (centred cosine)", "nnUNetTrainerDispersive", "nnunet"),
    "dispersive_l2": Method("nnU-Net + dispersive (InfoNCE-L2)", "nnUNetTrainerDispersive_infonceL2", "nnunet"),
    "dispersive_cosine": Method("nnU-Net + dispersive (uncentred cosine)", "nnUNetTrainerDispersive_cosine", "nnunet"),
    "meddisseg": Method("Med-DisSeg", "nnUNetTrainerMedDisSeg", "meddisseg"),
    "meddisseg_paper": Method("Med-DisSeg, paper settings", "nnUNetTrainerMedDisSeg_paperSettings", "meddisseg"),
    "meddisseg_sgd": Method("Med-DisSeg, SGD 1e-2", "nnUNetTrainerMedDisSeg_scratchSGD", "meddisseg"),
    "meddisseg_sgd_centred": Method("Med-DisSeg, SGD 1e-2, centred cosine dispersion",
                                    "nnUNetTrainerMedDisSeg_scratchSGDCentred", "meddisseg"),
    "meddisseg_centred": Method("Med-DisSeg, centred cosine dispersion",
                                "nnUNetTrainerMedDisSeg_cosineCentred", "meddisseg"),
    "meddisseg_adam": Method("Med-DisSeg, Adam 1e-3", "nnUNetTrainerMedDisSeg_scratchAdam", "meddisseg"),
    "meddisseg_nodispersive": Method("Med-DisSeg, no dispersive loss",
                                     "nnUNetTrainerMedDisSeg_noDispersive", "meddisseg"),
    "meddisseg_stage2only": Method("Med-DisSeg, dispersive loss in Stage II only",
                                   "nnUNetTrainerMedDisSeg_dispersiveStage2Only", "meddisseg"),
    "meddisseg_relu": Method("Med-DisSeg, ReLU instead of TeLU", "nnUNetTrainerMedDisSeg", "meddisseg_relu"),
    "plain_paper": Method("Med-DisSeg network, plain, Adam 1e-4/1e-5",
                          "nnUNetTrainerMedDisSeg_plainPaper", "meddisseg"),
    "plain_sgd": Method("Med-DisSeg network, plain, SGD 1e-2", "nnUNetTrainerMedDisSeg_plainSGD", "meddisseg"),
    "plain_adam": Method("Med-DisSeg network, plain, Adam 1e-3", "nnUNetTrainerMedDisSeg_plainAdam", "meddisseg"),
}
#: the default comparison reference of every p-value (``--baseline``)
BASELINE = "default"

# ------------------------------------------------------------------------------------------------
# preparation


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


# ------------------------------------------------------------------------------------------------
# budgets


class Budget(NamedTuple):
    """The same training iterations at ``batch`` (``iterations``), training images (``images``, each
    method at its plans' batch) or training minutes (``minutes``: the sum of nnU-Net's epoch durations)."""

    kind: str
    amount: float
    batch: Optional[int] = None  #: ``iterations`` only

    @property
    def label(self) -> str:
        return f"{self.kind}{self.amount:g}" + (f"_bs{self.batch}" if self.batch else "")

    def describe(self) -> str:
        if self.kind == "iterations":
            return f"{self.amount:g} training iterations per run at batch {self.batch}"
        return f"{self.amount:g} training {self.kind} per run, each method at its plans' batch"


def parse_budget(text: str) -> Budget:
    kind, _, amount = text.partition(":")
    try:
        value = float(amount)
    except ValueError:
        value = math.nan
    if kind not in ("iterations", "images", "minutes") or not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected iterations:N, images:N or minutes:M with a number above 0, "
                                         f"got {text!r}")
    return Budget(kind, value)


def iterations_per_epoch(budget: Budget, epochs: int, batch: int, calibration: Optional[dict] = None) -> int:
    """Training iterations per epoch that spend ``budget`` in ``epochs`` epochs at ``batch``.

    ``calibration`` (``minutes`` only): a finished run of the same method and ``epochs`` on the same device,
    ``{"epoch_seconds": [...], "iterations_per_epoch": n}``. Epoch durations above their median count as
    one-off overhead (compilation, the first epoch after a resume); the rest scales with the iterations."""
    if budget.kind == "iterations":
        return max(1, round(budget.amount / epochs))
    if budget.kind == "images":
        return max(1, math.ceil(budget.amount / (batch * epochs)))
    seconds = calibration["epoch_seconds"]
    median = float(np.median(seconds))
    overhead = sum(max(0.0, s - median) for s in seconds)
    iterations = math.floor(calibration["iterations_per_epoch"] * (60 * budget.amount - overhead)
                            / (sum(seconds) - overhead))
    if iterations < 1:
        raise UserError(f"--budget {budget.kind}:{budget.amount:g} is too small: the calibration run spent "
                        f"{overhead:.0f} s on overhead and {sum(seconds) - overhead:.0f} s on "
                        f"{calibration['iterations_per_epoch']} iterations per epoch")
    return iterations


# ------------------------------------------------------------------------------------------------
# training logs

_LOG_SECTIONS = {"loss terms: ": "loss", "dispersion: ": "dispersion",
                 "gradient norms (before clipping): ": "grad_norm"}


def read_training_log(log_file: Path) -> dict:
    """Per-epoch figures from an nnU-Net training log: epoch times, pseudo Dice, and our trainers'
    ``loss terms`` / ``dispersion`` / ``gradient norms`` lines as ``{section_name: [per epoch]}``."""
    text = log_file.read_text(errors="replace") if log_file.is_file() else ""
    curves: Dict[str, List[float]] = {}
    for line in text.splitlines():
        for prefix, section in _LOG_SECTIONS.items():
            at = line.find(prefix)
            if at < 0:
                continue
            for item in line[at + len(prefix):].strip().split(", "):
                name, _, value = item.strip().rpartition(" ")
                try:
                    number = float(value)
                except ValueError:
                    continue
                curves.setdefault(f"{section}_{name}", []).append(number)
    pseudo = [float(v) for v in re.findall(r"Pseudo dice \[(?:np\.float32\()?([0-9.]+)", text)]
    return {"epoch_times_s": [float(v) for v in re.findall(r"Epoch time: ([0-9.]+) s", text)],
            "pseudo_dice": pseudo, "curves": curves}


def _first_last(values: Sequence[float]) -> Optional[List[float]]:
    return [values[0], values[-1]] if values else None


# ------------------------------------------------------------------------------------------------
# one run


class Study:
    """Runs (method, seed) of ``AblationRun``s (one ``nnUNet_results`` folder per seed): none starts after
    ``soft`` or ``hard`` (epoch seconds), a command still running at ``hard`` is stopped."""

    def __init__(self, soft: float = math.inf, hard: float = math.inf):
        self.soft, self.hard = soft, hard
        self.lock = threading.Lock()

    def may_start(self) -> bool:
        return time.time() < min(self.soft, self.hard)

    def remaining(self) -> Optional[float]:
        return None if math.isinf(self.hard) else max(0.0, self.hard - time.time())

    def run(self, runner: AblationRun, key: str, seed: int) -> dict:
        spec = runner.variants[key]
        tag = f"{key}_seed{seed}"
        result = {"method": key, "seed": seed, "trainer": spec.trainer, "plans": spec.plans}
        if not self.may_start():
            return {**result, "status": "not started (deadline)"}
        try:
            state = runner.state(key, seed)
            self._say(f"start {tag}" + (" (resuming the interrupted training with --c)" if state == "interrupted"
                                        else ""))
            if state in ("new", "interrupted"):
                runner.train(key, seed, self.remaining())
            record = (runner.load_record(key, seed) if state == "finished"
                      else runner.predict_and_evaluate(key, seed, self.remaining()))
        except CommandStopped:
            self._say(f"stopped {tag} at the end of the piece: the same command continues it")
            return {**result, "status": "stopped at the end of the piece"}
        except UserError as e:
            self._say(f"FAILED {tag}: {e}")
            return {**result, "status": f"failed: {e}"}
        fold_dir = runner.fold_folder(key, seed)
        summary = record["summary"]
        result.update({"train_wall_s": record["train_seconds"], "predict_wall_s": record["predict_seconds"],
                       "epoch_seconds": record.get("epoch_seconds"),
                       "test_per_case": {c["case"]: {k: c[k] for k in METRICS} for c in summary["metric_per_case"]},
                       "test_mean": {k: summary["mean"][k] for k in METRICS}})
        validation = fold_dir / "validation" / "summary.json"
        if validation.is_file():
            result["val_dice"] = json.loads(validation.read_text())["foreground_mean"]["Dice"]
        logs = sorted(fold_dir.glob("training_log_*.txt"))
        result.update(read_training_log(logs[-1] if logs else runner.out / "logs" / f"{key}_seed{seed}_train.log"))
        result["status"] = "done"
        self._say(f"done {tag}: validation mDSC {_pct(result.get('val_dice'))}, test mDSC "
                  f"{_pct(result['test_mean']['dice'])}")
        return result

    def _say(self, text: str) -> None:
        with self.lock:
            print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ------------------------------------------------------------------------------------------------
# aggregation


def _pct(v: Optional[float]) -> str:
    return f"{100 * v:.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "–"


def _mean_sd(values: Sequence[float]) -> Dict[str, Optional[float]]:
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None, "n": len(v)}


def _seed_mean_dice(runs: Sequence[dict], seeds: Sequence[int]) -> Dict[str, float]:
    """Each test image's Dice averaged over the runs of ``seeds``."""
    chosen = [r for r in runs if r["seed"] in seeds]
    cases = sorted(chosen[0]["test_per_case"])
    return {c: float(np.mean([r["test_per_case"][c]["dice"] for r in chosen])) for c in cases}


def aggregate(runs: Sequence[dict], methods: Sequence[str], baseline: str = BASELINE) -> Dict[str, dict]:
    """Per method: seeds done, mean / sd over seeds of validation and test metrics, and the paired
    comparison of test Dice to ``baseline`` over the seeds both completed."""
    done = {k: [r for r in runs if r["method"] == k and r["status"] == "done"] for k in methods}
    table = {}
    for key in methods:
        rs = done[key]
        row = {"name": METHODS[key].name, "trainer": METHODS[key].trainer, "seeds": [r["seed"] for r in rs],
               "val_dice": _mean_sd([r.get("val_dice") for r in rs]),
               "test": {k: _mean_sd([r["test_mean"][k] for r in rs]) for k in METRICS},
               "train_wall_s": _mean_sd([r.get("train_wall_s") for r in rs]),
               "s_per_iteration": _mean_sd([sum(r["epoch_times_s"]) / max(1, r["iterations"]) for r in rs
                                            if r.get("epoch_times_s")])}
        diagnostics = {}
        for name in sorted({n for r in rs for n in r["curves"]}):
            firsts_lasts = [_first_last(r["curves"][name]) for r in rs if r["curves"].get(name)]
            diagnostics[name] = {"first_epoch": float(np.mean([f[0] for f in firsts_lasts])),
                                 "last_epoch": float(np.mean([f[1] for f in firsts_lasts]))}
        row["diagnostics"] = diagnostics
        reference = done.get(baseline, [])
        common = sorted({r["seed"] for r in rs} & {r["seed"] for r in reference})
        if key != baseline and common:
            a, b = _seed_mean_dice(rs, common), _seed_mean_dice(reference, common)
            d = np.array([a[c] - b[c] for c in sorted(a)])
            p = wilcoxon_p_value(d)[0]
            row["vs_baseline"] = {"seeds": common, "mean_dice_difference": float(d.mean()), "p_value": p,
                                  "images_better": int((d > 0).sum()), "images_worse": int((d < 0).sum())}
        table[key] = row
    return table


def _fmt_ms(s: Dict[str, Optional[float]], scale: float = 100.0, digits: int = 1) -> str:
    if s["mean"] is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    return text + (f" ± {scale * s['sd']:.{digits}f}" if s["sd"] is not None else "")


def _p_value(v: Optional[dict]) -> str:
    if not v:
        return "–"
    return f"{v['p_value']:.1e}" if v["p_value"] < 1e-3 else f"{v['p_value']:.3f}"


def _markdown(payload: dict) -> str:
    st = payload["settings"]
    out = [f"Kvasir-SEG ({st['dataset']}) resized to {st['size']}x{st['size']}: {st['train_cases']} training / "
           f"{st['val_cases']} validation (nnU-Net fold 0) / {st['test_cases']} test images"
           + (" (**debugging subset**)" if st["subset"] else "") + f". Every run: {st['epochs']} epochs (Med-DisSeg's "
           f"Stage I the first quarter), a checkpoint every epoch; test prediction "
           f"{'with' if st['test_time_augmentation'] else 'without'} nnU-Net's mirroring. Encoder: "
           f"{st['encoder_weights']}. Train min: the sum of nnU-Net's epoch durations (compilation included; "
           "process start-up and a stopped piece's unfinished epoch not).", "",
           "val mDSC: nnU-Net's final validation of the fold-0 validation cases (choose settings on this). "
           "Test metrics: this package's evaluator on the test images (percent). Each cell: mean ± standard "
           f"deviation over seeds. Δ, p: test mDSC difference to {METHODS[payload['baseline']].name} and the "
           "two-sided Wilcoxon signed-rank p-value over the test images (each image's Dice averaged over the "
           "seeds both completed).", ""]
    diagnostics = []
    for label, table in payload["tables"].items():
        out += [f"### {Budget(**payload['budgets'][label]).describe()}", ""]
        rows = []
        for key, r in table.items():
            mine = [run for run in payload["runs"] if run["budget"] == label and run["method"] == key]
            v = r.get("vs_baseline")
            rows.append([r["name"], f"`{r['trainer']}`", len(r["seeds"]),
                         ", ".join(sorted({str(run["batch"]) for run in mine})),
                         ", ".join(sorted({f"{run['images_seen']:,}" for run in mine})),
                         _fmt_ms(r["train_wall_s"], 1 / 60), _fmt_ms(r["val_dice"]),
                         *[_fmt_ms(r["test"][k]) for k in METRICS],
                         f"{100 * v['mean_dice_difference']:+.1f}" if v else "–", _p_value(v)])
            diagnostics += [[label, r["name"], name, f"{d['first_epoch']:.4g} → {d['last_epoch']:.4g}"]
                            for name, d in r["diagnostics"].items()
                            if name.startswith(("grad_norm", "dispersion", "loss_dispersive", "loss_seg"))]
        out += [markdown_table(["method", "trainer", "seeds", "batch", "images seen", "train min", "val mDSC",
                                *[f"test {METRIC_TITLES[k]}" for k in METRICS], "Δ mDSC", "p"], rows), ""]
    if diagnostics:
        out += ["Training diagnostics (mean over seeds; first → last epoch):", "",
                markdown_table(["budget", "method", "figure", "first → last epoch"], diagnostics), ""]
    if payload["pending"]:
        out += ["Not yet done: " + "; ".join(payload["pending"]) + ".", ""]
    out += ["Pieces: " + "; ".join(f"{pc['date']} on {pc['device_name']}, {pc['wall_s'] / 60:.1f} min, "
                                   f"torch.compile {pc['compile']}" for pc in payload["pieces"]) + "."]
    return "\n".join(out) + "\n"


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
    p.add_argument("--no-final-validation", action="store_true",
                   help="skip nnU-Net's final validation of the fold-0 validation cases (no validation scores)")
    p.add_argument("--methods", nargs="+", default=["default", "meddisseg", "dispersive"], choices=list(METHODS),
                   help="methods to train")
    p.add_argument("--baseline", default=BASELINE, choices=list(METHODS),
                   help="the method every other one is compared to (paired test)")
    p.add_argument("--seeds", type=int, default=1, help="runs per method and budget (seeds 0 .. N-1)")
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
                   help="passed to nnUNetv2_meddisseg_plan --encoder-weights (default: random initialisation)")
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
                  start + 60 * args.piece_min if args.piece_min is not None else math.inf)
    payload = _run(args, kvasir, work, study, start)
    files = write_results(args.out, args.name, payload, _markdown(payload))
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
        name = _dataset_folder(env["nnUNet_raw"], args.dataset_id).name
        if (Path(env["nnUNet_preprocessed"]) / name / "nnUNetPlans.json").is_file():
            print(f"[1-2/5] reusing the converted and preprocessed {name} in {work}")
            return
    stamp_file.unlink(missing_ok=True)
    print(f"[1/5] converting Kvasir-SEG ({kvasir}) at {args.size}x{args.size}")
    command = ["nnUNetv2_meddisseg_convert", "kvasir-seg", str(kvasir), "-d", dataset, "--resize", str(args.size),
               "--overwrite", "-np", str(args.num_processes)]
    if args.max_train_cases is not None or args.max_test_cases is not None:
        split = write_subset_split(work / "subset_split.json", args.max_train_cases, args.max_test_cases)
        print(f"  debugging subset: {len(split['train'])} train / {len(split['val'])} val / {len(split['test'])} test")
        command += ["--split-file", str(work / "subset_split.json")]
    for old in Path(env["nnUNet_preprocessed"]).glob(f"Dataset{args.dataset_id:03d}_*"):
        shutil.rmtree(old)
    run_logged(command, env, logs / "convert.log")
    print("[2/5] nnU-Net planning and preprocessing (2d)")
    run_logged(["nnUNetv2_plan_and_preprocess", "-d", dataset, "-c", CONFIGURATION, "-np", str(args.num_processes)],
               planning_environment(env), logs / "plan_and_preprocess.log")
    stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")


def _environment(args, work: Path) -> Dict[str, str]:
    """The runs' environment: this process's (AblationRun starts from os.environ) with the work folder's
    nnU-Net folders, data-augmentation processes and torch.compile as asked."""
    env = set_nnunet_environment(os.environ, work)
    env.setdefault("nnUNet_def_n_proc", str(args.num_processes))
    if args.da_processes is not None:
        env[DATA_AUGMENTATION_PROCESSES_VARIABLE] = str(args.da_processes)
    elif args.device == "cpu":
        env.setdefault(DATA_AUGMENTATION_PROCESSES_VARIABLE, "2")
    if args.no_compile:
        env["nnUNet_compile"] = "f"
    return env


def _previous_results(path: Path, settings: dict) -> dict:
    """The results file this run extends (empty if none); refused if it was made with other settings."""
    if not path.is_file():
        return {}
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"quality.py: error: {path} is not valid JSON ({e}): restore it or choose another --name")
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
                (self.preprocessed / f"{name}.json").write_text(json.dumps(plans, indent=4) + "\n")
            else:
                command = ["nnUNetv2_meddisseg_plan", "-d", str(self.args.dataset_id), "--plans-name", name,
                           *MEDDISSEG_PLANS[family][1]]
                command += ["--batch-size", str(budget.batch)] if budget.batch else []
                command += ["--encoder-weights", self.args.encoder_weights] if self.args.encoder_weights else []
                run_logged(command, planning_environment(self.env), self.work / "logs" / f"{name}_plan.log")
        plans = json.loads((self.preprocessed / f"{name}.json").read_text())
        return name, int(plans["configurations"][CONFIGURATION]["batch_size"])


def _run(args, kvasir: Path, work: Path, study: Study, start: float) -> dict:
    env = _environment(args, work)
    _prepare_data(args, kvasir, env, work)
    raw = _dataset_folder(env["nnUNet_raw"], args.dataset_id)
    preprocessed = Path(env["nnUNet_preprocessed"]) / raw.name
    splits = json.loads((preprocessed / "splits_final.json").read_text())[0]
    labels = {k: int(v) for k, v in json.loads((raw / "dataset.json").read_text())["labels"].items()}
    settings = {"dataset": raw.name, "size": args.size, "train_cases": len(splits["train"]),
                "val_cases": len(splits["val"]), "test_cases": len(list((raw / "labelsTs").glob("*.png"))),
                "subset": args.max_train_cases is not None or args.max_test_cases is not None, "epochs": args.epochs,
                "val_iterations_per_epoch": args.val_iterations, "final_validation": not args.no_final_validation,
                "test_time_augmentation": not args.disable_tta,
                "encoder_weights": args.encoder_weights or "random initialisation (no ImageNet weights)"}
    previous = _previous_results(Path(args.out) / f"{args.name}.json", settings)
    runs = {(r["budget"], r["method"], r["seed"]): r for r in previous.get("runs", [])}
    machine = machine_info(args.device)
    device_name = machine.get("gpu", machine["cpu"])
    budgets = {**previous.get("budgets", {}), **{b.label: b._asdict() for b in args.budget}}
    plans, pending, lock = Plans(args, env, work, preprocessed), [], threading.Lock()
    order = [(b, k, seed) for seed in range(args.seeds) for b in args.budget for k in args.methods]
    chosen = selected_runs(order, runs, args.next_seed)
    pending += [f"{b.label} {k} seed {seed} (a later command: --next-seed runs one seed per command)"
                for b, k, seed in order if (b.label, k, seed) not in runs and (b, k, seed) not in chosen]
    print(f"[3/5] budgets {', '.join(b.label for b in args.budget)}, {args.epochs} epochs per run; "
          f"{sum(k in runs for k in ((b.label, m, s) for b, m, s in order))} of {len(order)} runs done before")

    def payload() -> dict:
        done = list(runs.values())
        return {"machine": machine, "command": command_line(), "settings": settings, "budgets": budgets,
                "baseline": args.baseline,
                "tables": {label: aggregate([r for r in done if r["budget"] == label],
                                            [k for k in METHODS if any(r["budget"] == label and r["method"] == k
                                                                       for r in done)], args.baseline)
                           for label in budgets},
                "pieces": [*previous.get("pieces", []), {"date": machine["date"], "device_name": device_name,
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
                iterations = _iterations(args, budget, key, batch, out, list(runs.values()), device_name)
        except UserError as e:
            pending.append(f"{what} ({e})")
            return
        if iterations is None:
            pending.append(f"{what} (waits for {key}'s equal-images run on {device_name})")
            return
        runner = AblationRun(out, raw.name, FOLD, {key: Variant(METHODS[key].trainer, plans_name)}, args.device,
                             raw / "imagesTs", raw / "labelsTs", labels, args.disable_tta, predict_processes=1)
        result = study.run(runner, key, seed)
        if result["status"] != "done":
            pending.append(f"{what} ({result['status']})")
            return
        result.update(budget=budget.label, batch=batch, iterations_per_epoch=iterations,
                      iterations=args.epochs * iterations, images_seen=args.epochs * iterations * batch,
                      device_name=device_name)
        with lock:
            runs[(budget.label, key, seed)] = result
            current = payload()
            write_results(args.out, args.name, current, _markdown(current))

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


def _iterations(args, budget: Budget, key: str, batch: int, out: Path, runs: List[dict], device_name: str
                ) -> Optional[int]:
    """Iterations per epoch of ``key``'s runs of ``budget``, fixed in ``out/budget.json`` when first chosen;
    None while an equal-minutes budget has no calibration run yet."""
    if (out / "budget.json").is_file():
        return json.loads((out / "budget.json").read_text())["iterations_per_epoch"]
    calibration = None
    if budget.kind == "minutes":
        calibration = next((r for r in runs if r["method"] == key and r["budget"].startswith("images")
                            and r["device_name"] == device_name and r.get("epoch_seconds")), None)
        if calibration is None:
            return None
    iterations = iterations_per_epoch(budget, args.epochs, batch, calibration)
    write_budget(out, ScheduleRecipe(num_epochs=args.epochs, iterations_per_epoch=iterations,
                                     val_iterations_per_epoch=args.val_iterations, save_every=1,
                                     final_validation=not args.no_final_validation, torch_threads=args.threads))
    return iterations


if __name__ == "__main__":
    raise SystemExit(main())
