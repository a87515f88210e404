"""The arms of ``benchmarks/quality.py``'s study (:data:`METHODS`), one run of an arm (:class:`Study`) and the
tables of the runs: the figures read from a run's training log, the mean and standard deviation over seeds, and the
paired comparison of test Dice to the baseline (the Wilcoxon signed-rank test over the test images)."""
import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np
from common import markdown_table
from quality_budgets import Budget

from nnunetv2_meddisseg.ablation.runs import AblationRun, epoch_seconds
from nnunetv2_meddisseg.ablation.table import BINARY_METRICS as METRICS
from nnunetv2_meddisseg.ablation.table import METRIC_TITLES
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.evaluation.paired_statistics import wilcoxon_p_value
from nnunetv2_meddisseg.logged_command import CommandStopped
from nnunetv2_meddisseg.training.curves import SUMMARY_SECTIONS


class Method(NamedTuple):
    name: str
    trainer: str
    family: str  # "nnunet" (nnU-Net's plans and network) or a key of MEDDISSEG_PLANS
    #: pretrained arms: the arm trained from scratch that they are compared to (``p_vs_scratch``); its network is
    #: pretrained by ``nnUNetv2_meddisseg_pretrain`` on the fold's training cases, seeded with the run's seed
    scratch: Optional[str] = None
    #: pretrained arms: ``nnUNetv2_meddisseg_pretrain --method``
    pretraining: str = "restoration"

    @property
    def pretrained(self) -> bool:
        return self.scratch is not None


RECIPES = Path(__file__).resolve().parent / "recipes"

#: Med-DisSeg plans families: plans name stem -> extra ``nnUNetv2_meddisseg_plan`` arguments
MEDDISSEG_PLANS: Dict[str, tuple] = {
    "meddisseg": ("nnUNetMedDisSegPlans", ()),
    "meddisseg_relu": ("nnUNetMedDisSegPlans_relu", ("--activation", "relu")),
    # Stage II trains the encoder at the decoder's rate (1e-4), not a tenth of it
    "meddisseg_encoder_lr": ("nnUNetMedDisSegPlans_encoderLR",
                             ("--recipe", str(RECIPES / "encoder_at_decoder_rate.json"))),
}


METHODS: Dict[str, Method] = {
    "default": Method("nnU-Net (default)", "nnUNetTrainerBaseline", "nnunet"),
    "dispersive": Method("nnU-Net + dispersive (centred cosine)", "nnUNetTrainerDispersive", "nnunet"),
    "dispersive_l2": Method("nnU-Net + dispersive (InfoNCE-L2)", "nnUNetTrainerDispersive_infonceL2", "nnunet"),
    "dispersive_cosine": Method("nnU-Net + dispersive (uncentred cosine)", "nnUNetTrainerDispersive_cosine", "nnunet"),
    "meddisseg": Method("Med-DisSeg", "nnUNetTrainerMedDisSeg", "meddisseg"),
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
    # the encoder pretrained, then nnUNetv2_meddisseg_plan --encoder_weights FILE
    "meddisseg_pretrained": Method("Med-DisSeg + pretraining", "nnUNetTrainerMedDisSeg", "meddisseg", "meddisseg"),
    # the whole network pretrained on nnUNetPlans, then nnUNetv2_train ... -pretrained_weights FILE
    "default_pretrained": Method("nnU-Net (default) + pretraining", "nnUNetTrainerBaseline", "nnunet", "default"),
    # the other pretraining methods, to choose among on validation data
    "meddisseg_masked": Method("Med-DisSeg + masked image modelling", "nnUNetTrainerMedDisSeg", "meddisseg",
                               "meddisseg", "masked"),
    "meddisseg_contrastive": Method("Med-DisSeg + SimCLR", "nnUNetTrainerMedDisSeg", "meddisseg", "meddisseg",
                                    "contrastive"),
    "default_masked": Method("nnU-Net (default) + masked image modelling", "nnUNetTrainerBaseline", "nnunet",
                             "default", "masked"),
    "default_contrastive": Method("nnU-Net (default) + SimCLR", "nnUNetTrainerBaseline", "nnunet", "default",
                                  "contrastive"),
    # is the encoder's tenth of the decoder's rate in Stage II what keeps a pretrained encoder from adapting?
    "meddisseg_encoder_lr": Method("Med-DisSeg, encoder at the decoder's rate", "nnUNetTrainerMedDisSeg",
                                   "meddisseg_encoder_lr"),
    "meddisseg_masked_encoder_lr": Method("Med-DisSeg + masked image modelling, encoder at the decoder's rate",
                                          "nnUNetTrainerMedDisSeg", "meddisseg_encoder_lr", "meddisseg_encoder_lr",
                                          "masked"),
}
#: the default comparison reference of every p-value (``--baseline``)
BASELINE = "default"


# ------------------------------------------------------------------------------------------------
# training logs

#: the log line's title of each summary section (training.curves) -> its key in the parsed log
_LOG_SECTIONS = {f"{title}: ": prefix.rstrip("_") for prefix, title, _ in SUMMARY_SECTIONS}


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
    ``soft`` or ``hard`` (epoch seconds), a command still running at ``hard`` is stopped. ``validation_only``: no
    test prediction; a run's figures are those of nnU-Net's final validation."""

    def __init__(self, soft: float = math.inf, hard: float = math.inf, validation_only: bool = False):
        self.soft, self.hard, self.validation_only = soft, hard, validation_only
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
            if self.validation_only:
                epochs = epoch_seconds(runner.fold_folder(key, seed) / "checkpoint_final.pth")
                record = {"train_seconds": float(sum(epochs)), "predict_seconds": 0.0, "epoch_seconds": epochs,
                          "summary": None}
            else:
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
                       "epoch_seconds": record.get("epoch_seconds")})
        if summary is not None:
            result.update({"test_per_case": {c["case"]: {k: c[k] for k in METRICS}
                                             for c in summary["metric_per_case"]},
                           "test_mean": {k: summary["mean"][k] for k in METRICS}})
        validation = fold_dir / "validation" / "summary.json"
        if validation.is_file():
            found = json.loads(validation.read_text())
            result["val_dice"] = found["foreground_mean"]["Dice"]
            # nnU-Net's per-case metrics, of the first foreground label (Kvasir-SEG has one)
            first_label = [(Path(c["reference_file"]).name.split(".")[0], next(iter(c["metrics"].values())))
                           for c in found["metric_per_case"]]
            result["val_per_case"] = {case: {"dice": m["Dice"], "iou": m["IoU"]} for case, m in first_label}
        elif self.validation_only:
            self._say(f"FAILED {tag}: no final validation ({validation} missing)")
            return {**result, "status": f"failed: no final validation ({validation} missing)"}
        logs = sorted(fold_dir.glob("training_log_*.txt"))
        result.update(read_training_log(logs[-1] if logs else runner.out / "logs" / f"{key}_seed{seed}_train.log"))
        result["status"] = "done"
        self._say(f"done {tag}: validation mDSC {_pct(result.get('val_dice'))}, test mDSC "
                  f"{_pct(result.get('test_mean', {}).get('dice'))}")
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


def _seed_mean_dice(runs: Sequence[dict], seeds: Sequence[int], split: str = "test") -> Dict[str, float]:
    """Each image's Dice (``split``: ``test`` or ``val``) averaged over the runs of ``seeds``."""
    chosen = [r for r in runs if r["seed"] in seeds]
    cases = sorted(chosen[0][f"{split}_per_case"])
    return {c: float(np.mean([r[f"{split}_per_case"][c]["dice"] for r in chosen])) for c in cases}


def aggregate(runs: Sequence[dict], methods: Sequence[str], baseline: str = BASELINE) -> Dict[str, dict]:
    """Per method: seeds done, mean / sd over seeds of validation and test metrics, and the paired
    comparison of test Dice to ``baseline`` over the seeds both completed (of validation Dice where the runs have no
    test predictions: ``vs_baseline["split"]``)."""
    done = {k: [r for r in runs if r["method"] == k and r["status"] == "done"] for k in methods}
    table = {}
    for key in methods:
        rs = done[key]
        row = {"name": METHODS[key].name, "trainer": METHODS[key].trainer, "seeds": [r["seed"] for r in rs],
               "val_dice": _mean_sd([r.get("val_dice") for r in rs]),
               "test": {k: _mean_sd([r["test_mean"][k] for r in rs if "test_mean" in r]) for k in METRICS},
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
        split = "test" if all("test_per_case" in r for r in rs + reference) else "val"
        if key != baseline and common and all(f"{split}_per_case" in r for r in rs + reference):
            a, b = _seed_mean_dice(rs, common, split), _seed_mean_dice(reference, common, split)
            d = np.array([a[c] - b[c] for c in sorted(a)])
            p = wilcoxon_p_value(d)[0]
            row["vs_baseline"] = {"split": split, "seeds": common, "mean_dice_difference": float(d.mean()),
                                  "p_value": p,
                                  "images_better": int((d > 0).sum()), "images_worse": int((d < 0).sum())}
        table[key] = row
    return table


def pretraining_arms(runs: Sequence[dict], table: Dict[str, dict], baseline: str = BASELINE) -> List[dict]:
    """The arms of the pretraining study under one budget: ``table`` (:func:`aggregate` of ``runs``) summarised per
    method, with each pretrained arm's paired comparison to its arm from scratch (:func:`aggregate` with that arm
    as the baseline). Minutes: the means over seeds of the pretraining's and the fine-tuning's epoch durations."""
    arms = []
    for key, row in table.items():
        method = METHODS[key]
        mine = [r for r in runs if r["method"] == key and r["status"] == "done"]
        to_scratch = None
        if method.pretrained and method.scratch in table:
            to_scratch = aggregate(runs, [method.scratch, key], method.scratch)[key].get("vs_baseline")
        to_default = row.get("vs_baseline")
        pretrain = _mean_sd([r.get("pretrain_minutes") for r in mine])["mean"] if method.pretrained else 0.0
        finetune = _mean_sd([r.get("train_wall_s") for r in mine])["mean"]
        finetune = finetune / 60 if finetune is not None else None
        arms.append({"method": key, "name": method.name, "pretrained": method.pretrained, "seeds": row["seeds"],
                     "test_mdsc_mean": row["test"]["dice"]["mean"], "test_mdsc_sd": row["test"]["dice"]["sd"],
                     "test_miou_mean": row["test"]["iou"]["mean"], "test_miou_sd": row["test"]["iou"]["sd"],
                     "val_mdsc_mean": row["val_dice"]["mean"], "val_mdsc_sd": row["val_dice"]["sd"],
                     "pretraining_method": method.pretraining if method.pretrained else None,
                     "compared_on": (to_default or to_scratch or {}).get("split"),
                     "delta_vs_default": 0.0 if key == baseline else
                     (to_default["mean_dice_difference"] if to_default else None),
                     "p_vs_default": to_default["p_value"] if to_default else None,
                     "delta_vs_scratch": to_scratch["mean_dice_difference"] if to_scratch else None,
                     "p_vs_scratch": to_scratch["p_value"] if to_scratch else None,
                     "pretrain_minutes": pretrain, "finetune_minutes": finetune,
                     "total_minutes": None if pretrain is None or finetune is None else pretrain + finetune})
    return arms


def add_equal_minutes(arms: Dict[str, List[dict]], runs: Sequence[dict], budgets: Dict[str, dict],
                      epochs: int) -> None:
    """Each pretrained arm's comparison at equal total minutes, added to ``arms`` (per budget label): its network from
    scratch for the arm's pretraining and fine-tuning minutes. The arm's own runs give the rate: N fine-tuning
    iterations took ``finetune_minutes``, so its ``total_minutes`` are worth N x total / fine-tune iterations
    (``equal_minutes_iterations``; measured within the same runs, so the machine's load cancels). The scratch runs
    are those of another ``iterations`` budget at the same batch nearest to that, if within one iteration per epoch
    (``equal_minutes_budget``; None where the results file has none: run the scratch arm at that budget)."""
    for label, rows in arms.items():
        budget = budgets[label]
        for arm in rows:
            method = METHODS[arm["method"]]
            arm.update(equal_minutes_iterations=None, equal_minutes_budget=None, scratch_equal_minutes_mdsc_mean=None,
                       scratch_equal_minutes_mdsc_sd=None, delta_vs_scratch_equal_minutes=None,
                       p_vs_scratch_equal_minutes=None)
            if not method.pretrained or budget["kind"] != "iterations" or not arm["finetune_minutes"]:
                continue
            target = budget["amount"] * arm["total_minutes"] / arm["finetune_minutes"]
            arm["equal_minutes_iterations"] = target
            candidates = [(abs(b["amount"] - target), other) for other, b in budgets.items()
                          if other != label and b["kind"] == "iterations" and b.get("batch") == budget.get("batch")
                          and abs(b["amount"] - target) <= epochs
                          and any(r["budget"] == other and r["method"] == method.scratch for r in runs)]
            if not candidates:
                continue
            other = min(candidates)[1]
            scratch = [r for r in runs if r["budget"] == other and r["method"] == method.scratch]
            mine = [r for r in runs if r["budget"] == label and r["method"] == arm["method"]]
            row = aggregate(scratch + mine, [method.scratch, arm["method"]], method.scratch)
            versus = row[arm["method"]].get("vs_baseline")
            dice = row[method.scratch]["test"]["dice"] if versus is None or versus["split"] == "test" else \
                row[method.scratch]["val_dice"]
            arm.update(equal_minutes_budget=other, scratch_equal_minutes_mdsc_mean=dice["mean"],
                       scratch_equal_minutes_mdsc_sd=dice["sd"],
                       delta_vs_scratch_equal_minutes=versus["mean_dice_difference"] if versus else None,
                       p_vs_scratch_equal_minutes=versus["p_value"] if versus else None)


def _fmt_ms(s: Dict[str, Optional[float]], scale: float = 100.0, digits: int = 1) -> str:
    if s["mean"] is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    return text + (f" ± {scale * s['sd']:.{digits}f}" if s["sd"] is not None else "")


def _p_value(v: Optional[dict]) -> str:
    if not v:
        return "–"
    return f"{v['p_value']:.1e}" if v["p_value"] < 1e-3 else f"{v['p_value']:.3f}"


def _number(v: Optional[float], scale: float = 100.0, sign: bool = False) -> str:
    return "–" if v is None else f"{scale * v:{'+' if sign else ''}.1f}"


def _p(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.1e}" if v < 1e-3 else f"{v:.3f}")


def _arms_markdown(payload: dict) -> List[str]:
    """The pretraining study's table of each budget with pretrained arms (``payload["arms"]``), with the comparison
    at equal total minutes (:func:`add_equal_minutes`)."""
    out = []
    validation = payload["settings"].get("validation_only", False)
    split = "validation" if validation else "test"
    for label, rows in (payload.get("arms") or {}).items():
        cells = []
        for a in rows:
            target = a.get("equal_minutes_iterations")
            if a.get("equal_minutes_budget"):
                scratch = payload["budgets"][a["equal_minutes_budget"]]["amount"]
                at_minutes = [f"{scratch:g} (for {target:.0f})", _fmt_ms({"mean": a["scratch_equal_minutes_mdsc_mean"],
                                                      "sd": a["scratch_equal_minutes_mdsc_sd"]}),
                              _number(a["delta_vs_scratch_equal_minutes"], sign=True),
                              _p(a["p_vs_scratch_equal_minutes"])]
            elif target:
                at_minutes = [f"{target:.0f} (not run)", "–", "–", "–"]
            else:
                at_minutes = ["–"] * 4
            cells.append([a["name"], "yes" if a["pretrained"] else "no", len(a["seeds"]),
                          _fmt_ms({"mean": a["test_miou_mean"], "sd": a["test_miou_sd"]}) if not validation else
                          _fmt_ms({"mean": a["val_mdsc_mean"], "sd": a.get("val_mdsc_sd")}),
                          _fmt_ms({"mean": a["test_mdsc_mean"], "sd": a["test_mdsc_sd"]}) if not validation else
                          (a["pretraining_method"] or "–"),
                          _number(a["delta_vs_default"], sign=True), _p(a["p_vs_default"]),
                          _number(a["delta_vs_scratch"], sign=True), _p(a["p_vs_scratch"]),
                          _number(a["pretrain_minutes"], 1), _number(a["finetune_minutes"], 1), *at_minutes])
        out += [f"### Pretraining study: {Budget(**payload['budgets'][label]).describe()}", "",
                f"Δ, p: {split} mDSC difference and Wilcoxon p-value over the {split} images to default nnU-Net and "
                "to the same arm from scratch. Minutes: the pretraining's and the fine-tuning's epoch durations "
                "(mean over seeds). Equal total minutes: the same network from scratch for the arm's pretraining "
                "and fine-tuning minutes, that is for the fine-tuning iterations times total / fine-tune minutes "
                "(the arm's own rate, so the machine's load cancels), from another iterations budget within one "
                "iteration per epoch of that: its iterations (for the arm's minutes' worth), its mDSC, and Δ, p of "
                "the arm to it.", "",
                markdown_table(["arm", "pretrained", "seeds", *(("val mDSC", "method") if validation else
                                                                ("test mIoU", "test mDSC")), "Δ vs default", "p",
                                "Δ vs scratch", "p", "pretrain min", "fine-tune min", "scratch iterations at equal "
                                "total min", f"its {split} mDSC", "Δ vs it", "p"], cells), ""]
    return out


def markdown(payload: dict) -> str:
    st = payload["settings"]
    validation = ["**Validation only**: no test image was predicted; Δ and p compare the fold-0 validation cases' "
                  "Dice (nnU-Net's final validation).", ""] if st.get("validation_only") else []
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
           "seeds both completed).", "", *validation]
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
    out += _arms_markdown(payload)
    if diagnostics:
        out += ["Training diagnostics (mean over seeds; first → last epoch):", "",
                markdown_table(["budget", "method", "figure", "first → last epoch"], diagnostics), ""]
    if payload["pending"]:
        out += ["Not yet done: " + "; ".join(payload["pending"]) + ".", ""]
    first = payload.get("command")  # the pieces of another command name it
    out += ["Pieces: " + "; ".join(f"{pc['date']} on {pc['device_name']}, {pc['wall_s'] / 60:.1f} min, "
                                   f"torch.compile {pc['compile']}"
                                   + (f", `{pc['command']}`" if pc.get("command", first) != first else "")
                                   for pc in payload["pieces"]) + "."]
    return "\n".join(out) + "\n"
