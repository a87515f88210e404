"""BatchNorm statistics of trained Med-DisSeg models: the validation score four ways, and how far the
running averages of training lie from statistics of the final weights, per part of the network.

Reads the runs of a ``quality.py`` work folder (``--work``) whose trainers keep BatchNorm's running
averages of training (``meddisseg_running_stats``, ``plain_paper_running_stats``: no re-estimation, a
copy of the model after Stage I in ``checkpoint_stage1.pth``), and default nnU-Net's runs as a control.
For each checkpoint (after Stage I, after Stage II) it predicts the fold's validation cases (whole
preprocessed images, no mirroring; mean per-image Dice of the foreground) with BatchNorm using:

- ``running``: the running averages of training (what nnU-Net predicts with when nothing re-estimates them);
- ``batch``: each batch's own statistics (training mode, momentum 0, batches of the training batch size);
- ``re-est. off`` / ``re-est. on``: statistics re-estimated with the final weights by the trainer's own
  ``_recalibrate_batchnorm`` over ``--samples`` training samples drawn without / with nnU-Net's
  training augmentation (``re-est. off N``: over ``--samples-large`` samples).

Drift per part (``encoder``, ``elat``, ``decoupling``, ``cdfa``, ``decoder``, ...): the mean over a part's
BatchNorm channels of ``|mu_running - mu| / sqrt(var)`` and of ``|log(var_running / var)|`` against the
re-estimated (augmentation off) statistics.

``--test off|on`` (after choosing on validation): writes ``checkpoint_bncal.pth`` (the final model with
statistics re-estimated that way) beside each final checkpoint, predicts the test images with nnU-Net's
``nnUNetPredictor`` (no mirroring, as ``quality.py --disable-tta``) and scores them with the paper's
metrics; the table then compares, over the seeds, the runs' test scores with running averages (from
``quality.py``'s predictions) and with re-estimated statistics, with a paired Wilcoxon test per image.

Usage: ``python benchmarks/batchnorm_statistics.py --work WORK [--samples 64] [--test off] [--name NAME]``
"""
import argparse
import contextlib
import io
import json
import math
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from common import DEFAULT_OUT, command_line, machine_info, markdown_table, write_results
from nnunetv2_meddisseg.evaluation.paired_statistics import wilcoxon_p_value
from torch.nn.modules.batchnorm import _BatchNorm

from nnunetv2_meddisseg.training.base import unwrap_module
from nnunetv2_meddisseg.training.batchnorm_statistics import batchnorm_layers

STUDY_TRAINERS = {"nnUNetTrainerMedDisSeg_runningStatistics": "Med-DisSeg",
                  "nnUNetTrainerMedDisSeg_plainPaperRunningStatistics": "bare network",
                  "nnUNetTrainer": "nnU-Net (default)"}
WAYS = ("running", "batch", "re-est. off", "re-est. on", "re-est. off N")
RUN_FOLDER = re.compile(r"nnUNet_results_it(?P<iterations>\d+)_bs(?P<batch>\d+)_seed(?P<seed>\d+)$")


# ------------------------------------------------------------------------------------------------
# the runs
def find_runs(work: Path) -> List[dict]:
    runs = []
    for results in sorted(work.glob("nnUNet_results_*")):
        match = RUN_FOLDER.match(results.name)
        if not match:
            continue
        for model in sorted(results.glob("Dataset*/*__*__2d")):
            trainer, plans, _ = model.name.split("__")
            base = trainer[:-len("_budget")] if trainer.endswith("_budget") else trainer
            if base not in STUDY_TRAINERS or not (model / "fold_0" / "checkpoint_final.pth").is_file():
                continue
            runs.append({"results": results, "model": model, "trainer": trainer, "base": base, "plans": plans,
                         "dataset": model.parent.name, "batch": int(match["batch"]), "seed": int(match["seed"]),
                         "iterations": int(match["iterations"])})
    return runs


@contextlib.contextmanager
def _environment(work: Path, results: Path):
    from nnunetv2_meddisseg.nnunet_env import nnunet_environment

    saved = dict(os.environ)
    env = nnunet_environment(work, [str(work / "trainers")])
    env["nnUNet_results"] = str(results)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def load_trainer(run: dict, checkpoint: str, log_file: Path):
    """The run's trainer on the CPU with ``checkpoint`` loaded; its log goes to ``log_file``."""
    from nnunetv2.run.run_training import get_trainer_from_args

    with contextlib.redirect_stdout(io.StringIO()):
        trainer = get_trainer_from_args(run["dataset"], "2d", 0, run["trainer"], run["plans"],
                                        device=torch.device("cpu"))
        trainer.log_file = str(log_file)
        trainer.load_checkpoint(str(run["model"] / "fold_0" / checkpoint))
    return trainer


# ------------------------------------------------------------------------------------------------
# scoring the validation cases
def validation_cases(trainer):
    _, dataset_val = trainer.get_tr_and_val_datasets()
    images, labels = [], []
    for key in sorted(dataset_val.identifiers):
        data, seg, _, _ = dataset_val.load_case(key)
        images.append(torch.from_numpy(np.asarray(data)[:, 0].astype(np.float32)))
        labels.append(np.asarray(seg)[0, 0])
    shapes = {tuple(i.shape) for i in images}
    if len(shapes) != 1:
        raise SystemExit(f"validation images differ in size ({sorted(shapes)}): convert with --resize")
    return torch.stack(images), np.stack(labels)


def mean_dice(logits: torch.Tensor, labels: np.ndarray) -> float:
    prediction = logits.argmax(1).numpy() > 0
    reference = labels > 0
    scores = []
    for p, r in zip(prediction, reference):
        denominator = p.sum() + r.sum()
        scores.append(1.0 if denominator == 0 else 2.0 * np.logical_and(p, r).sum() / denominator)
    return float(np.mean(scores))


def predict(trainer, images: torch.Tensor, batch: int, batch_statistics: bool) -> torch.Tensor:
    network = unwrap_module(trainer.network)
    head = trainer._plain_head() if hasattr(trainer, "_plain_head") else None
    modules = [m for m in (network, head) if m is not None]
    layers = batchnorm_layers(modules)
    momenta = [layer.momentum for layer in layers]
    for module in modules:
        module.train(batch_statistics)
    for layer in layers:
        layer.momentum = 0.0  # batch statistics used, running averages left as they are
    try:
        with torch.no_grad():
            chunks = []
            for start in range(0, len(images), batch):
                x = images[start:start + batch]
                if hasattr(trainer, "_validation_logits"):
                    chunks.append(trainer._validation_logits(x, network, head).float())
                else:
                    out = network(x)
                    chunks.append((out[0] if isinstance(out, (list, tuple)) else out).float())
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
        for module in modules:
            module.eval()
    return torch.cat(chunks)


def _buffers(trainer) -> Dict[str, Dict[str, torch.Tensor]]:
    network, head = trainer._plain_network(), trainer._plain_head()
    named = [(f"network.{n}", m) for n, m in network.named_modules()]
    if head is not None:
        named += [(f"head.{n}", m) for n, m in head.named_modules()]
    return {name: {"mean": m.running_mean.clone(), "var": m.running_var.clone(),
                   "tracked": m.num_batches_tracked.clone()}
            for name, m in named if isinstance(m, _BatchNorm) and m.track_running_stats}


def _restore(trainer, saved: Dict[str, Dict[str, torch.Tensor]]) -> None:
    network, head = trainer._plain_network(), trainer._plain_head()
    modules = dict((f"network.{n}", m) for n, m in network.named_modules())
    if head is not None:
        modules.update((f"head.{n}", m) for n, m in head.named_modules())
    for name, state in saved.items():
        modules[name].running_mean.copy_(state["mean"])
        modules[name].running_var.copy_(state["var"])
        modules[name].num_batches_tracked.copy_(state["tracked"])


def part_of(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "head":
        return "Stage I head"
    if parts[1] == "encoder" and len(parts) > 2:
        return f"encoder.{parts[2]}"
    return parts[1]


def drift(running: Dict[str, Dict[str, torch.Tensor]], estimated: Dict[str, Dict[str, torch.Tensor]]) -> dict:
    per_part: Dict[str, Dict[str, List[float]]] = {}
    for name, state in running.items():
        new = estimated[name]
        if int(new["tracked"]) == 0:
            continue  # not reached by this stage's forward
        std = torch.sqrt(new["var"].double() + 1e-5)
        mean_shift = ((state["mean"].double() - new["mean"].double()).abs() / std).tolist()
        log_ratio = torch.log((state["var"].double() + 1e-5) / (new["var"].double() + 1e-5)).abs().tolist()
        part = per_part.setdefault(part_of(name), {"mean_shift": [], "log_var_ratio": []})
        part["mean_shift"] += mean_shift
        part["log_var_ratio"] += log_ratio
    return {part: {"mean_shift": float(np.mean(v["mean_shift"])), "log_var_ratio": float(np.mean(v["log_var_ratio"])),
                   "channels": len(v["mean_shift"])} for part, v in per_part.items()}


def score_checkpoint(run: dict, checkpoint: str, args, log_file: Path) -> dict:
    trainer = load_trainer(run, checkpoint, log_file)
    images, labels = validation_cases(trainer)
    result = {"stage": getattr(trainer, "training_stage", None), "cases": len(images)}
    if not hasattr(trainer, "_recalibrate_batchnorm"):  # default nnU-Net: InstanceNorm, one way
        result["dice"] = {"running": mean_dice(predict(trainer, images, trainer.batch_size, False), labels)}
        return result
    running = _buffers(trainer)
    scores = {"running": mean_dice(predict(trainer, images, trainer.batch_size, False), labels),
              "batch": mean_dice(predict(trainer, images, trainer.batch_size, True), labels)}
    estimated = {}
    for way, augmentation, samples in (("re-est. off", False, args.samples), ("re-est. on", True, args.samples),
                                       ("re-est. off N", False, args.samples_large)):
        _restore(trainer, running)
        trainer.recipe = replace(trainer.recipe, batchnorm_calibration_samples=samples,
                                 batchnorm_calibration_augmentation=augmentation)
        trainer._calibration_batches = None
        trainer._recalibrate_batchnorm()
        scores[way] = mean_dice(predict(trainer, images, trainer.batch_size, False), labels)
        estimated[way] = _buffers(trainer)
    result["dice"] = scores
    result["drift"] = drift(running, estimated["re-est. off"])
    return result


# ------------------------------------------------------------------------------------------------
# test images with re-estimated statistics
def test_scores(run: dict, work: Path, augmentation: bool, args, log_file: Path) -> Dict[str, dict]:
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2_meddisseg.evaluation.evaluate import evaluate_folders

    trainer = load_trainer(run, "checkpoint_final.pth", log_file)
    trainer.recipe = replace(trainer.recipe, batchnorm_calibration_samples=args.samples,
                             batchnorm_calibration_augmentation=augmentation)
    trainer._calibration_batches = None
    trainer._recalibrate_batchnorm()
    fold = run["model"] / "fold_0"
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.save_checkpoint(str(fold / "checkpoint_bncal.pth"))
    raw = work / "nnUNet_raw" / run["dataset"]
    out = work / "predictions_bncal" / f"{run['trainer']}_bs{run['batch']}_seed{run['seed']}"
    predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=False, device=torch.device("cpu"),
                                verbose=False, verbose_preprocessing=False, allow_tqdm=False)
    with contextlib.redirect_stdout(io.StringIO()):
        predictor.initialize_from_trained_model_folder(str(run["model"]), use_folds=(0,),
                                                       checkpoint_name="checkpoint_bncal.pth")
        predictor.predict_from_files(str(raw / "imagesTs"), str(out), save_probabilities=False, overwrite=True,
                                     num_processes_preprocessing=1, num_processes_segmentation_export=1)
    os.remove(fold / "checkpoint_bncal.pth")
    summary = evaluate_folders(str(raw / "labelsTs"), str(out), progress=False)
    return {c["case"]: {k: c[k] for k in ("iou", "dice", "recall", "precision")} for c in summary["metric_per_case"]}


def quality_test_scores(work: Path, run: dict) -> Optional[Dict[str, dict]]:
    """The run's test scores with running averages, from ``quality.py``'s results files in ``work``."""
    for results in sorted(work.glob("results/*.json")):
        payload = json.loads(results.read_text())
        for r in payload.get("runs", []):
            if (r.get("trainer") == run["trainer"] and r.get("seed") == run["seed"]
                    and payload.get("budget", {}).get("batch") == run["batch"] and "test_per_case" in r):
                return r["test_per_case"]
    return None


# ------------------------------------------------------------------------------------------------
def _pct(v: Optional[float]) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:.1f}"


def _ms(values: List[float]) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return f"{100 * np.mean(values):.1f} ± {100 * sd:.1f}"


def markdown(payload: dict) -> str:
    lines = ["Validation mDSC (fold 0, whole images, no mirroring), mean ± sd over seeds; gap = way - running.", ""]
    rows = []
    groups: Dict[tuple, List[dict]] = {}
    for entry in payload["validation"]:
        groups.setdefault((entry["method"], entry["batch"], entry["checkpoint"]), []).append(entry)
    for (method, batch, checkpoint), entries in sorted(groups.items()):
        ways = [w for w in WAYS if w in entries[0]["dice"]]
        row = [method, batch, "after Stage I" if checkpoint == "checkpoint_stage1.pth" else "final", len(entries)]
        for way in WAYS:
            if way not in ways:
                row.append("-")
                continue
            values = [e["dice"][way] for e in entries]
            gap = "" if way == "running" else f" ({100 * np.mean([e['dice'][way] - e['dice']['running'] for e in entries]):+.1f})"
            row.append(_ms(values) + gap)
        rows.append(row)
    lines.append(markdown_table(["method", "batch", "checkpoint", "seeds", *WAYS], rows))
    drift_rows = []
    for (method, batch, checkpoint), entries in sorted(groups.items()):
        if "drift" not in entries[0]:
            continue
        for part in sorted({p for e in entries for p in e["drift"]}):
            shifts = [e["drift"][part]["mean_shift"] for e in entries if part in e["drift"]]
            ratios = [e["drift"][part]["log_var_ratio"] for e in entries if part in e["drift"]]
            drift_rows.append([method, batch, "after Stage I" if checkpoint == "checkpoint_stage1.pth" else "final",
                               part, f"{np.mean(shifts):.3f}", f"{np.mean(ratios):.3f}"])
    if drift_rows:
        lines += ["", "Drift of the running averages from statistics re-estimated with the final weights "
                      "(augmentation off), mean over seeds and channels:", "",
                  markdown_table(["method", "batch", "checkpoint", "part", "|Δmean| / std", "|log var ratio|"],
                                 drift_rows)]
    if payload.get("test"):
        lines += ["", f"Test (120 images, no mirroring), statistics re-estimated with augmentation "
                      f"{payload['test_augmentation']} over {payload['samples']} samples; mean ± sd over seeds; "
                      f"p: two-sided Wilcoxon signed-rank over images (each image's Dice averaged over seeds):", ""]
        rows = []
        for entry in payload["test"]:
            rows.append([entry["method"], entry["batch"], entry["seeds"], entry["running_mdsc"], entry["bncal_mdsc"],
                         entry["bncal_miou"], f"{entry['delta']:+.1f}", f"{entry['p']:.2g}"])
        lines.append(markdown_table(["method", "batch", "seeds", "test mDSC, running", "test mDSC, re-estimated",
                                     "test mIoU, re-estimated", "Δ mDSC", "p"], rows))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", required=True, help="a quality.py work folder")
    p.add_argument("--samples", type=int, default=64, help="training samples of the re-estimation")
    p.add_argument("--samples-large", type=int, default=256, help="samples of the 're-est. off N' way")
    p.add_argument("--test", choices=("off", "on"), default=None,
                   help="also score the test images with statistics re-estimated without / with augmentation")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--name", default="batchnorm_statistics", help="results file name")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the results files")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work).resolve()
    runs = find_runs(work)
    if not runs:
        raise SystemExit(f"--work {work}: no finished runs of {sorted(STUDY_TRAINERS)}")
    log_file = work / "logs" / "batchnorm_statistics_trainer.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    validation = []
    for run in runs:
        for checkpoint in ("checkpoint_stage1.pth", "checkpoint_final.pth"):
            if not (run["model"] / "fold_0" / checkpoint).is_file():
                continue
            with _environment(work, run["results"]):
                result = score_checkpoint(run, checkpoint, args, log_file)
            entry = {"method": STUDY_TRAINERS[run["base"]], "trainer": run["trainer"], "batch": run["batch"],
                     "seed": run["seed"], "iterations": run["iterations"], "checkpoint": checkpoint, **result}
            validation.append(entry)
            print(f"{entry['method']} bs{run['batch']} seed{run['seed']} {checkpoint}: "
                  + ", ".join(f"{k} {_pct(v)}" for k, v in result["dice"].items()), flush=True)
    payload = {"machine": machine_info("cpu"), "command": command_line(), "samples": args.samples,
               "samples_large": args.samples_large, "validation": validation}
    if args.test:
        payload["test_augmentation"] = args.test
        groups: Dict[tuple, List[dict]] = {}
        for run in runs:
            if run["base"] != "nnUNetTrainer":
                groups.setdefault((STUDY_TRAINERS[run["base"]], run["batch"]), []).append(run)
        payload["test"] = []
        for (method, batch), group in sorted(groups.items()):
            running, estimated = [], []
            for run in group:
                before = quality_test_scores(work, run)
                if before is None:
                    continue
                with _environment(work, run["results"]):
                    after = test_scores(run, work, args.test == "on", args, log_file)
                running.append(before)
                estimated.append(after)
                print(f"{method} bs{batch} seed{run['seed']}: test mDSC running "
                      f"{_pct(np.mean([c['dice'] for c in before.values()]))}, re-estimated "
                      f"{_pct(np.mean([c['dice'] for c in after.values()]))}", flush=True)
            if not running:
                continue
            cases = sorted(running[0])
            per_case_before = np.mean([[r[c]["dice"] for c in cases] for r in running], axis=0)
            per_case_after = np.mean([[r[c]["dice"] for c in cases] for r in estimated], axis=0)
            p_value, _ = wilcoxon_p_value(list(per_case_after - per_case_before))
            payload["test"].append({
                "method": method, "batch": batch, "seeds": len(running),
                "running_mdsc": _ms([np.mean([c["dice"] for c in r.values()]) for r in running]),
                "bncal_mdsc": _ms([np.mean([c["dice"] for c in r.values()]) for r in estimated]),
                "bncal_miou": _ms([np.mean([c["iou"] for c in r.values()]) for r in estimated]),
                "delta": 100 * float(np.mean(per_case_after - per_case_before)), "p": p_value,
                "per_seed_test_per_case": estimated})
    paths = write_results(Path(args.out), args.name, payload, markdown(payload))
    print(markdown(payload))
    print(f"wrote {paths['markdown']} and {paths['json']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
