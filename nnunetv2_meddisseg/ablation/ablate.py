"""``nnUNetv2_meddisseg_ablate``: train Med-DisSeg ablation variants with one budget, plans and seeds,
predict the test set, and tabulate the paper's metrics against the full method.

Each variant and the full method (``nnUNetTrainerMedDisSeg``, always added) trains once per seed 0 .. N-1. A
variant is a recipe variant (``tau0p5`` or ``nnUNetTrainerMedDisSeg_tau0p5``) on the plans ``-p``, or a network
ablation (``noELAT``, ``ReLU``, ``noCBAT``): the full method on plans with that option (``<plans>_noCBAT``). A
rerun skips finished runs and resumes interrupted ones with ``--c``. Writes ``OUT/ablation.md`` and ``.csv``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from nnunetv2_meddisseg.ablation.runs import (
    NETWORK_ABLATIONS,
    AblationRun,
    Variant,
    write_budget_plans,
    write_network_ablation_plans,
)
from nnunetv2_meddisseg.ablation.table import ablation_rows, markdown_table, write_csv
from nnunetv2_meddisseg.cli import (
    DefaultsHelpFormatter,
    add_device_argument,
    plain_text,
    resolve_device,
    run_command,
)
from nnunetv2_meddisseg.environment import use_our_trainers
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe

__all__ = ["FULL_METHOD", "resolve_variants", "main"]

PROG = "nnUNetv2_meddisseg_ablate"
FULL_METHOD = "nnUNetTrainerMedDisSeg"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=plain_text(__doc__.split("\n\n")[0]),
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("-d", "--dataset", required=True, help="dataset ID or name (planned and preprocessed for 2d)")
    p.add_argument("-f", "--fold", default="0", help="fold to train")
    p.add_argument("--variants", nargs="+", required=True, metavar="NAME",
                   help="recipe variants, e.g. noDispersive tau0p5 (short for nnUNetTrainerMedDisSeg_<NAME>) or full "
                        "trainer names, and network ablations noELAT ReLU noCBAT (the full method on plans with that "
                        "option); the full method nnUNetTrainerMedDisSeg is always added")
    p.add_argument("--epochs", type=int, default=None, help="epochs of every run (default: each trainer's own)")
    p.add_argument("--iterations_per_epoch", type=int, default=None,
                   help="training iterations per epoch (default: nnU-Net's 250)")
    p.add_argument("--val_iterations", type=int, default=None,
                   help="validation iterations per epoch (default: nnU-Net's 50)")
    p.add_argument("--final_validation", action="store_true",
                   help="run nnU-Net's validation of the fold after training (skipped by default: the test set is "
                        "what is compared)")
    p.add_argument("--seeds", type=int, default=3, help="runs per variant, with run seeds 0 .. N-1")
    p.add_argument("-p", "--plans", default="nnUNetPlans",
                   help="plans of every run (default nnUNetPlans; nnUNetMedDisSegPlans after nnUNetv2_meddisseg_plan)")
    p.add_argument("-o", "--output", default=None,
                   help="output folder (default: $nnUNet_results/<dataset>/meddisseg_ablation__<plans>__fold<F>)")
    add_device_argument(p, ("cpu", "cuda", "mps"), "device of every run")
    p.add_argument("--disable_tta", action="store_true", help="predict without test-time mirroring")
    p.add_argument("--predict_processes", type=int, default=2,
                   help="nnUNetv2_predict's -npp and -nps (0 predicts in its main process)")
    return p


def resolve_variants(names: Sequence[str], plans: str) -> Dict[str, Variant]:
    """``{variant name: Variant}``, the full method first; a network ablation trains on ``<plans>_<ablation>``."""
    from nnunetv2.utilities.find_objects import recursive_find_trainer_class_by_name

    use_our_trainers()
    resolved: Dict[str, Variant] = {}
    for name in [FULL_METHOD, *names]:
        short = name[len(FULL_METHOD) + 1:] if name.startswith(f"{FULL_METHOD}_") else name.lstrip("_")
        if short in NETWORK_ABLATIONS:
            resolved.setdefault(f"{plans}_{short}", Variant(FULL_METHOD, f"{plans}_{short}"))
            continue
        full = name if name.startswith("nnUNetTrainer") else f"{FULL_METHOD}_{short}"
        if full in resolved:
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                recursive_find_trainer_class_by_name(full)
        except (RuntimeError, AssertionError):
            raise UserError(f"--variants: no trainer class named {full} (from {name!r}) and no network ablation "
                            f"({', '.join(NETWORK_ABLATIONS)}); the variants are listed in docs/ablations.md, e.g. "
                            f"noDispersive, tau0p5, noCBAT") from None
        resolved[full] = Variant(full, plans)
    return resolved


def _check_settings(out: Path, settings: dict) -> None:
    """Write ``settings.json`` on the first run; a rerun must use the same budget, plans and fold."""
    file = out / "settings.json"
    if file.is_file():
        before = json.loads(file.read_text())
        changed = {k: (before.get(k), v) for k, v in settings.items() if before.get(k) != v}
        if changed:
            raise UserError(f"{out} was started with other settings ("
                            + ", ".join(f"{k}: {a} there, {b} now" for k, (a, b) in changed.items())
                            + "); rerun with the same options or choose another -o")
    else:
        out.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(settings, indent=1) + "\n")


def _dataset(dataset: str) -> tuple:
    """(dataset name, imagesTs, labelsTs, labels of dataset.json)."""
    from nnunetv2.paths import nnUNet_raw
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    try:
        name = maybe_convert_to_dataset_name(dataset)
    except RuntimeError as e:
        raise UserError(f"-d {dataset}: {e}") from None
    raw = Path(nnUNet_raw.require()) / name
    images, labels = raw / "imagesTs", raw / "labelsTs"
    for folder in (images, labels):
        if not folder.is_dir() or not any(folder.iterdir()):
            raise UserError(f"{folder} is missing or empty: the ablation evaluates the raw dataset's test set "
                            f"(imagesTs with labelsTs)")
    labels_json = json.loads((raw / "dataset.json").read_text())["labels"]
    return name, images, labels, {k: int(v) for k, v in labels_json.items() if isinstance(v, int)}


def _validate(args: argparse.Namespace) -> None:
    for option in ("epochs", "iterations_per_epoch", "val_iterations", "seeds"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UserError(f"--{option} must be at least 1, got {value}")
    if args.predict_processes < 0:
        raise UserError(f"--predict_processes must be at least 0, got {args.predict_processes}")


def _progress(done: int, total: int, variant: str, seed: int, state: str, durations: List[float]) -> None:
    eta = (f"about {sum(durations) / len(durations) * (total - done) / 60:.1f} min left" if durations
           else "time left known after the first run")
    action = {"finished": "finished earlier, skipped", "trained": "trained earlier; predicting",
              "interrupted": "resuming the interrupted training (--c)", "new": "training"}[state]
    print(f"[{done + 1}/{total}] {variant} seed {seed}: {action}; {eta}", flush=True)


def _ablate(argv: Optional[Sequence[str]]) -> None:
    from nnunetv2.paths import nnUNet_preprocessed, nnUNet_results

    args = _parser().parse_args(argv)
    args.device = resolve_device(args.device)
    _validate(args)
    name, images, labels, label_values = _dataset(args.dataset)
    variants = resolve_variants(args.variants, args.plans)
    out = Path(args.output or Path(nnUNet_results.require()) / name
               / f"meddisseg_ablation__{args.plans}__fold{args.fold}").resolve()
    budget = ScheduleRecipe(num_epochs=args.epochs, iterations_per_epoch=args.iterations_per_epoch,
                            val_iterations_per_epoch=args.val_iterations, final_validation=args.final_validation)
    _check_settings(out, {"dataset": name, "fold": args.fold, "plans": args.plans, "epochs": args.epochs,
                          "iterations_per_epoch": args.iterations_per_epoch, "val_iterations": args.val_iterations,
                          "final_validation": args.final_validation})
    preprocessed = Path(nnUNet_preprocessed.require()) / name
    for variant in variants.values():
        if variant.plans != args.plans:
            write_network_ablation_plans(preprocessed, args.plans, variant.plans[len(args.plans) + 1:])
    budget = {k: v for k, v in vars(budget).items() if v is not None}
    variants = {key: Variant(v.trainer, write_budget_plans(preprocessed, v.plans, budget))
                for key, v in variants.items()}
    run = AblationRun(out, name, args.fold, variants, args.device, images, labels, label_values,
                      args.disable_tta, args.predict_processes)
    todo = [(variant, seed) for seed in range(args.seeds) for variant in variants]
    durations: List[float] = []
    for i, (variant, seed) in enumerate(todo):
        state = run.state(variant, seed)
        _progress(i, len(todo), variant, seed, state, durations)
        if state == "finished":
            continue
        start = time.monotonic()
        if state != "trained":
            run.train(variant, seed)
        run.predict_and_evaluate(variant, seed)
        durations.append(time.monotonic() - start)
    records = {v: {s: run.load_record(v, s) for s in range(args.seeds)} for v in variants}
    rows = ablation_rows(records, FULL_METHOD, list(variants))
    write_csv(rows, str(out / "ablation.csv"))
    _write_markdown(out / "ablation.md", rows, name, args, len(records[FULL_METHOD][0]["summary"]["metric_per_case"]))
    print(f"wrote {out / 'ablation.md'} and {out / 'ablation.csv'}")


def _write_markdown(file: Path, rows: list, dataset: str, args: argparse.Namespace, cases: int) -> None:
    epochs = args.epochs if args.epochs is not None else "each trainer's own number of"
    budget = f"{epochs} epochs x {args.iterations_per_epoch or 250} iterations"
    file.write_text(
        f"# Ablation on {dataset}, fold {args.fold}, plans {args.plans}\n\n"
        f"Budget: {budget} per run; {args.seeds} seed(s) per variant (run seeds 0 .. {args.seeds - 1}); "
        f"{cases} test cases; device {args.device}{', no test-time mirroring' if args.disable_tta else ''}.\n"
        f"Metrics in %: mean ± sd over seeds of the mean over test cases. Δ: variant - full method; p: paired "
        f"two-sided Wilcoxon signed-rank test over test cases (each case averaged over seeds). Minutes per run: "
        f"nnU-Net's summed epoch times plus prediction, mean over seeds.\n\n"
        + markdown_table(rows, FULL_METHOD))


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _ablate, argv)


if __name__ == "__main__":
    sys.exit(main())
