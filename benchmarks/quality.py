"""Budgeted quality study on Kvasir-SEG: default nnU-Net, nnU-Net + dispersive loss and Med-DisSeg
(and its training-recipe variants), several seeds each, all through nnU-Net's own commands.

Every method is trained for the same budget: the same number of training iterations (``--iterations``,
in epochs of ``--iterations-per-epoch``) at the same batch size (``--batch``), on the same images.
Each run is scored twice: on the 88 fold-0 validation cases by nnU-Net's own final validation
(``validation/summary.json``: the numbers to choose settings on) and on the 120 test images
(predicted with ``nnUNetv2_predict``, scored with the paper's metrics by this package's evaluator:
the numbers to report, once).

Phases (each subprocess writes a log file under ``WORK/logs``):

1. ``nnUNetv2_meddisseg_convert kvasir-seg KVASIR -d ID --resize SIZE``: the shipped seeded split,
   792 train / 88 validation (nnU-Net fold 0) / 120 test. Read from ``--kvasir`` (default:
   ``$NNUNETV2_MEDDISSEG_TEST_DATA/Kvasir-SEG``), written to ``WORK/nnUNet_raw``.
2. ``nnUNetv2_plan_and_preprocess -d ID -c 2d``; reused on a rerun with the same work folder.
3. Plans with the budget's batch size (``nnUNetPlans_bs<B>``, a copy of nnUNetPlans; ``nnUNetv2_meddisseg_plan
   --batch-size B`` for each of ``MEDDISSEG_PLANS`` a method uses), and the budget as the recipe override file
   ``WORK/runs_<tag>/budget.json`` (``ablation.runs.write_budget``), which every run's trainer reads.
4. For every (method, seed), ``--parallel`` at a time, seed-major so that ``--deadline-min`` leaves whole
   seeds: one run of ``nnunetv2_meddisseg.ablation.runs.AblationRun`` (the runner of
   ``nnUNetv2_meddisseg_ablate``): ``nnUNetv2_train`` with one ``nnUNet_results`` folder per seed and
   ``nnUNet_meddisseg_seed`` = the seed (resumed with ``--c``), ``nnUNetv2_predict`` on the test images, the
   evaluation. A finished run is reused on a rerun.
5. One table (``<name>.json`` / ``.md``): per method the mean and spread over seeds of validation mDSC
   and of the four test metrics, the difference to the ``--baseline`` method's test mDSC with a two-sided
   Wilcoxon signed-rank p-value over the test images (each image's Dice averaged over the seeds both
   methods completed), wall time, and training diagnostics read from the logs (first and last epoch).

No ImageNet weights unless ``--encoder-weights`` names a local ResNet-50 state dict (or
``imagenet`` where the plan command supports it): Med-DisSeg's encoder starts from random
initialisation. torch.compile is off in the training runs (``nnUNet_compile=f``) unless ``--compile``.

Usage: ``python benchmarks/quality.py --kvasir PATH [--size 64] [--iterations N] [--iterations-per-epoch N]
[--batch 4] [--methods default meddisseg ...] [--seeds 3] [--parallel 1] [--device cpu|cuda] [--work DIR]``
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
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from common import DEFAULT_OUT, command_line, machine_info, markdown_table, write_results
from nnunetv2_meddisseg.ablation.runs import AblationRun, Variant, write_budget
from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.environment import DATA_AUGMENTATION_PROCESSES_VARIABLE, set_nnunet_environment
from nnunetv2_meddisseg.logged_command import run_logged
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe

DATASET_ID = 502
CONFIGURATION = "2d"
FOLD = "0"
METRICS = ("iou", "dice", "recall", "precision")
METRIC_TITLES = {"iou": "mIoU", "dice": "mDSC", "recall": "Recall", "precision": "Precision"}
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


# ------------------------------------------------------------------------------------------------
# a deadline


class Deadline:
    """No new run starts after ``soft`` (epoch seconds); runs already started finish."""

    def __init__(self, soft: float):
        self.soft = soft

    def may_start(self) -> bool:
        return time.time() < self.soft


# ------------------------------------------------------------------------------------------------
# training logs

_LOG_SECTIONS = {"loss terms: ": "loss", "dispersion: ": "dispersion", "gradient norms (before clipping): ": "grad_norm"}


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
    """The runs of one budget: an ``AblationRun`` (one ``nnUNet_results`` folder per seed) and the deadline."""

    def __init__(self, runner: AblationRun, deadline: Deadline):
        self.runner, self.deadline = runner, deadline
        self.lock = threading.Lock()

    def run(self, key: str, seed: int) -> dict:
        spec = self.runner.variants[key]
        tag = f"{key}_seed{seed}"
        result = {"method": key, "seed": seed, "trainer": spec.trainer, "plans": spec.plans}
        if not self.deadline.may_start():
            return {**result, "status": "not started (deadline)"}
        try:
            self._say(f"start {tag}")
            state = self.runner.state(key, seed)
            if state in ("new", "interrupted"):
                self.runner.train(key, seed)
            record = (self.runner.load_record(key, seed) if state == "finished"
                      else self.runner.predict_and_evaluate(key, seed))
        except UserError as e:
            self._say(f"FAILED {tag}: {e}")
            return {**result, "status": f"failed: {e}"}
        fold_dir = self.runner.fold_folder(key, seed)
        summary = record["summary"]
        result.update({"train_wall_s": record["train_seconds"], "predict_wall_s": record["predict_seconds"],
                       "test_per_case": {c["case"]: {k: c[k] for k in METRICS} for c in summary["metric_per_case"]},
                       "test_mean": {k: summary["mean"][k] for k in METRICS}})
        validation = fold_dir / "validation" / "summary.json"
        if validation.is_file():
            result["val_dice"] = json.loads(validation.read_text())["foreground_mean"]["Dice"]
        logs = sorted(fold_dir.glob("training_log_*.txt"))
        result.update(read_training_log(logs[-1] if logs else self.runner.out / "logs" / f"{key}_seed{seed}_train.log"))
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
    from scipy import stats

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
            p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else 1.0
            row["vs_baseline"] = {"seeds": common, "mean_dice_difference": float(d.mean()), "p_value": p,
                                  "images_better": int((d > 0).sum()), "images_worse": int((d < 0).sum())}
        table[key] = row
    return table


def _fmt_ms(s: Dict[str, Optional[float]], scale: float = 100.0, digits: int = 1) -> str:
    if s["mean"] is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    return text + (f" ± {scale * s['sd']:.{digits}f}" if s["sd"] is not None else "")


def _markdown(payload: dict) -> str:
    b, d = payload["budget"], payload["data"]
    out = [f"Kvasir-SEG ({payload['dataset']}) resized to {d['size']}x{d['size']}: {d['train_cases']} training / "
           f"{d['val_cases']} validation (nnU-Net fold 0) / {d['test_cases']} test images"
           + (" (**debugging subset**)" if d["subset"] else "") + f"; device {payload['device']}. Budget for every "
           f"run: **{b['iterations']} training iterations** ({b['epochs']} epochs x {b['iterations_per_epoch']}) at "
           f"**batch {b['batch']}** = {b['iterations'] * b['batch']} training images; Med-DisSeg's Stage I = the "
           f"first {b['meddisseg_stage1_epochs']} epochs (none for the plain variants). Seeds per method: "
           f"{payload['seeds']}; {payload['parallel']} runs at a time; torch.compile "
           f"{'on' if payload['compile'] else 'off'}; test prediction "
           f"{'with' if payload.get('test_time_augmentation', True) else 'without'} nnU-Net's mirroring. "
           f"Encoder: {payload['encoder_weights']}.", "",
           "val mDSC: nnU-Net's final validation of the fold-0 validation cases (choose settings on this). "
           "Test metrics: this package's evaluator on the test images (percent). Each cell: mean ± standard "
           f"deviation over seeds. Δ, p: test mDSC difference to {METHODS[payload.get('baseline', BASELINE)].name} "
           "and the two-sided Wilcoxon "
           "signed-rank p-value over the test images (each image's Dice averaged over the seeds both completed).", ""]
    rows = []
    for key, r in payload["table"].items():
        v = r.get("vs_baseline")
        rows.append([r["name"], f"`{r['trainer']}`", len(r["seeds"]), _fmt_ms(r["val_dice"]),
                     *[_fmt_ms(r["test"][k]) for k in METRICS],
                     f"{100 * v['mean_dice_difference']:+.1f}" if v else "–",
                     (f"{v['p_value']:.1e}" if v["p_value"] < 1e-3 else f"{v['p_value']:.3f}") if v else "–",
                     _fmt_ms(r["train_wall_s"], 1 / 60), _fmt_ms(r["s_per_iteration"], 1.0, 3)])
    out.append(markdown_table(["method", "trainer", "seeds", "val mDSC", *[f"test {METRIC_TITLES[k]}" for k in METRICS],
                               "Δ mDSC", "p", "train min / run", "s / iteration"], rows))
    out += ["", "Training diagnostics (mean over seeds; first → last epoch):", ""]
    diag_rows = []
    for key, r in payload["table"].items():
        for name, v in r["diagnostics"].items():
            if name.startswith(("grad_norm", "dispersion", "loss_fg_bg", "loss_dispersive", "loss_seg")):
                diag_rows.append([r["name"], name, f"{v['first_epoch']:.4g} → {v['last_epoch']:.4g}"])
    out.append(markdown_table(["method", "figure", "first → last epoch"], diag_rows))
    failed = [f"{r['method']} seed {r['seed']}: {r['status']}" for r in payload["runs"] if r["status"] != "done"]
    if failed:
        out += ["", "Runs not completed: " + "; ".join(failed) + "."]
    out += ["", f"Total time {payload['total_wall_s'] / 60:.1f} min."]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# the benchmark


def _default_kvasir() -> Optional[str]:
    root = os.environ.get(DATA_VARIABLE)
    return str(Path(root) / "Kvasir-SEG") if root else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kvasir", default=_default_kvasir(),
                   help=f"Kvasir-SEG folder (images/, masks/), read only (default: ${DATA_VARIABLE}/Kvasir-SEG)")
    p.add_argument("--size", type=int, default=64, help="images resized to SIZE x SIZE (paper: 256)")
    p.add_argument("--iterations", type=int, default=2000, help="training iterations per run (the budget)")
    p.add_argument("--iterations-per-epoch", type=int, default=50,
                   help="iterations per nnU-Net epoch (Med-DisSeg's Stage I is the first quarter of the epochs)")
    p.add_argument("--batch", type=int, default=4, help="batch size of every method (paper: 4)")
    p.add_argument("--val-iterations", type=int, default=5,
                   help="validation batches per epoch (nnU-Net's online pseudo Dice; nnU-Net's default is 50)")
    p.add_argument("--no-final-validation", action="store_true",
                   help="skip nnU-Net's final validation of the fold-0 validation cases (no validation scores)")
    p.add_argument("--methods", nargs="+", default=["default", "meddisseg", "dispersive"], choices=list(METHODS),
                   help="methods to train")
    p.add_argument("--baseline", default=BASELINE, choices=list(METHODS),
                   help="the method every other one is compared to (paired test)")
    p.add_argument("--seeds", type=int, default=1, help="runs per method (seeds 0 .. N-1)")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time")
    p.add_argument("--deadline-min", type=float, default=None,
                   help="start no run after this many minutes (runs already started finish)")
    p.add_argument("--disable-tta", action="store_true",
                   help="predict the test images without nnU-Net's mirroring (4x faster on a CPU)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--compile", action="store_true", help="let nnU-Net torch.compile the networks (CUDA only)")
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
    p.add_argument("--name", default="quality", help="results file name (NAME.json / NAME.md)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the results files")
    return p


def _check_args(args) -> Path:
    if args.kvasir is None:
        raise SystemExit(f"quality.py: error: --kvasir is required (or set {DATA_VARIABLE} to the folder holding "
                         f"Kvasir-SEG/)")
    if args.baseline not in args.methods:
        raise SystemExit(f"quality.py: error: --baseline {args.baseline} is not among --methods {' '.join(args.methods)}")
    if args.size < 32 or args.size % 16:
        raise SystemExit(f"quality.py: error: --size must be a multiple of 16 and at least 32, got {args.size}")
    if args.iterations < 1 or args.iterations_per_epoch < 1 or args.iterations % args.iterations_per_epoch:
        raise SystemExit(f"quality.py: error: --iterations ({args.iterations}) must be a positive multiple of "
                         f"--iterations-per-epoch ({args.iterations_per_epoch})")
    if args.batch < 2:
        raise SystemExit(f"quality.py: error: --batch must be at least 2 (the dispersive loss needs pairs), "
                         f"got {args.batch}")
    for name in ("seeds", "parallel", "threads", "max_train_cases", "max_test_cases"):
        value = getattr(args, name)
        if value is not None and value < (2 if name.startswith("max") else 1):
            raise SystemExit(f"quality.py: error: --{name.replace('_', '-')} is too small: {value}")
    kvasir = Path(args.kvasir).resolve()
    if not (kvasir / "images").is_dir() or not (kvasir / "masks").is_dir():
        raise SystemExit(f"quality.py: error: --kvasir {kvasir}: expected a Kvasir-SEG folder with images/ and masks/")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("quality.py: error: --device cuda: CUDA is not available")
    return kvasir


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    kvasir = _check_args(args)
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_quality_")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"work folder (kept): {work}")
    start = time.time()
    soft = start + 60 * args.deadline_min if args.deadline_min is not None else math.inf
    payload = _run(args, kvasir, work, Deadline(soft))
    payload["total_wall_s"] = time.time() - start
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
               env, logs / "plan_and_preprocess.log")
    stamp_file.write_text(json.dumps(stamp, indent=1) + "\n")


def _run(args, kvasir: Path, work: Path, deadline: Deadline) -> dict:
    from nnunetv2_meddisseg.training.recipes import MEDDISSEG

    # the runs' environment is this process's (AblationRun starts from os.environ)
    env = set_nnunet_environment(os.environ, work)
    env.setdefault("nnUNet_def_n_proc", str(args.num_processes))
    if args.da_processes is not None:
        env[DATA_AUGMENTATION_PROCESSES_VARIABLE] = str(args.da_processes)
    elif args.device == "cpu":
        env.setdefault(DATA_AUGMENTATION_PROCESSES_VARIABLE, "2")
    if not args.compile:
        env["nnUNet_compile"] = "f"
    dataset = str(args.dataset_id)
    _prepare_data(args, kvasir, env, work)
    raw = _dataset_folder(env["nnUNet_raw"], args.dataset_id)
    preprocessed = Path(env["nnUNet_preprocessed"]) / raw.name
    splits = json.loads((preprocessed / "splits_final.json").read_text())[0]
    num_test = len([f for f in (raw / "labelsTs").iterdir() if f.name.endswith(".png")])

    epochs = args.iterations // args.iterations_per_epoch
    stage1_epochs = int(math.floor(MEDDISSEG.stage1_fraction * epochs))
    print(f"[3/5] budget: {args.iterations} iterations = {epochs} epochs x {args.iterations_per_epoch}, batch "
          f"{args.batch}; Med-DisSeg Stage I {stage1_epochs} epochs")
    out = work / f"runs_it{args.iterations}_bs{args.batch}"
    write_budget(out, ScheduleRecipe(num_epochs=epochs, iterations_per_epoch=args.iterations_per_epoch,
                                     val_iterations_per_epoch=args.val_iterations,
                                     final_validation=not args.no_final_validation, torch_threads=args.threads))
    plans = {"nnunet": f"nnUNetPlans_bs{args.batch}"}
    plans.update({family: f"{stem}_bs{args.batch}" for family, (stem, _) in MEDDISSEG_PLANS.items()})
    write_batch_plans(preprocessed, "nnUNetPlans", plans["nnunet"], args.batch)
    for family in sorted({METHODS[k].family for k in args.methods} & set(MEDDISSEG_PLANS)):
        command = ["nnUNetv2_meddisseg_plan", "-d", dataset, "--batch-size", str(args.batch), "--plans-name",
                   plans[family], *MEDDISSEG_PLANS[family][1]]
        if args.encoder_weights:
            command += ["--encoder-weights", args.encoder_weights]
        run_logged(command, env, work / "logs" / f"{family}_plan.log")

    labels = json.loads((raw / "dataset.json").read_text())["labels"]
    runner = AblationRun(out, raw.name, FOLD, {k: Variant(METHODS[k].trainer, plans[METHODS[k].family])
                                               for k in args.methods}, args.device, raw / "imagesTs",
                         raw / "labelsTs", {k: int(v) for k, v in labels.items()}, args.disable_tta,
                         predict_processes=1)
    study = Study(runner, deadline)
    order = [(k, s) for s in range(args.seeds) for k in args.methods]
    print(f"[4/5] {len(order)} runs, {args.parallel} at a time")
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda ks: study.run(*ks), order))
    for r in runs:
        r["iterations"] = args.iterations
    print("[5/5] results")
    return {"machine": machine_info(args.device), "command": command_line(), "dataset": raw.name,
            "data": {"size": args.size, "train_cases": len(splits["train"]), "val_cases": len(splits["val"]),
                     "test_cases": num_test,
                     "subset": args.max_train_cases is not None or args.max_test_cases is not None},
            "budget": {"iterations": args.iterations, "iterations_per_epoch": args.iterations_per_epoch,
                       "epochs": epochs, "batch": args.batch, "val_iterations_per_epoch": args.val_iterations,
                       "meddisseg_stage1_epochs": stage1_epochs},
            "device": args.device, "seeds": args.seeds, "parallel": args.parallel, "compile": args.compile,
            "test_time_augmentation": not args.disable_tta,
            "encoder_weights": args.encoder_weights or "random initialisation (no ImageNet weights)",
            "environment": {k: env.get(k) for k in (DATA_AUGMENTATION_PROCESSES_VARIABLE, "nnUNet_def_n_proc",
                                                    "nnUNet_compile")},
            "baseline": args.baseline, "table": aggregate(runs, args.methods, args.baseline),
            "runs": runs}


if __name__ == "__main__":
    raise SystemExit(main())
