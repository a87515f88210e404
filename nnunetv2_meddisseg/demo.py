"""``nnUNetv2_meddisseg_demo``: the whole job on an embedded default, through nnU-Net's own commands.

Trains default nnU-Net and Med-DisSeg on a generated polyp-like dataset (or Kvasir-SEG, ``--kvasir``) for the same
short schedule and compares their test predictions. Everything lives under the output folder; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from nnunetv2_meddisseg.cli import (
    DefaultsHelpFormatter,
    add_device_argument,
    plain_text,
    resolve_device,
    run_command,
)
from nnunetv2_meddisseg.environment import (
    DATA_AUGMENTATION_PROCESSES_VARIABLE,
    SEED_ENVIRONMENT_VARIABLE,
    nnunet_environment,
    planning_environment,
)
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.logged_command import run_logged

__all__ = ["main"]

#: --schedule: (default nnU-Net trainer, Med-DisSeg trainer), equal numbers of training iterations
SCHEDULES = {
    "demo": ("nnUNetTrainerBaseline_demo", "nnUNetTrainerMedDisSeg_demo"),  # 8 epochs x 15 iterations
    "smoke": ("nnUNetTrainerBaseline_smoke", "nnUNetTrainerMedDisSeg_smoke"),  # 3 epochs x 4 iterations
}
PLANS = "nnUNetMedDisSegPlans"


#: minutes and GB of disk of one run of each --schedule (generated dataset, default --size), as in docs/testing.md
COST = {
    "demo": {"minutes": 5.1, "disk_gb": 1.2, "machine": "a 2-core CPU"},
    "smoke": {"minutes": 2.2, "disk_gb": 1.2, "machine": "a 2-core CPU"},
}


def announcement(schedule: str, out: Path, kvasir: bool) -> str:
    """What the demo will take (``COST``) and the free disk at ``out``, with a warning where that is too little."""
    cost = COST[schedule]
    lines = [f"Schedule '{schedule}': about {cost['minutes']:.0f} min on {cost['machine']} (less on a GPU) and "
             f"about {cost['disk_gb']:.1f} GB of disk under {out}."]
    if kvasir:
        lines.append("These figures are for the generated dataset: Kvasir-SEG's 1,000 images take longer to "
                     "convert, preprocess and predict, and more disk.")
    existing = next(p for p in (out, *out.parents) if p.exists())
    free_gb = shutil.disk_usage(existing).free / 1e9
    if free_gb < cost["disk_gb"]:
        lines.append(f"WARNING: only {free_gb:.1f} GB free at {existing}: the demo may run out of disk.")
    return "\n".join(lines)


def _run(command: List[str], env: dict, log_dir: Path) -> None:
    """Run one console command with its output in the next numbered log file of ``log_dir``."""
    run_logged(command, env, log_dir / f"{len(list(log_dir.glob('*.log'))):02d}_{command[0]}.log")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nnUNetv2_meddisseg_demo", description=plain_text(__doc__.splitlines()[0]),
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("-o", "--output", default="meddisseg_demo",
                   help="folder for nnU-Net's raw/preprocessed/results folders, logs and the comparison "
                        "(default: ./meddisseg_demo)")
    p.add_argument("--kvasir", default=None, metavar="PATH",
                   help="a Kvasir-SEG folder (images/, masks/) to use (default: a generated polyp-like dataset)")
    p.add_argument("--size", type=int, default=64, help="image size in pixels")
    add_device_argument(p, what="device to train and predict on")
    p.add_argument("--schedule", default="demo", choices=sorted(SCHEDULES),
                   help="training schedule of both models: 'demo' (8 epochs x 15 iterations) or 'smoke' "
                        "(3 x 4: checks the whole pipeline in a few minutes; the tests use it)")
    p.add_argument("--seed", type=int, default=0,
                   help=f"run seed of both trainings ({SEED_ENVIRONMENT_VARIABLE}): the same seed gives the same "
                        f"table on a CPU")
    return p


def _demo(argv: Optional[Sequence[str]]) -> None:
    args = _parser().parse_args(argv)
    args.device = resolve_device(args.device)
    baseline_trainer, meddisseg_trainer = SCHEDULES[args.schedule]
    if args.seed < 0:
        raise UserError(f"--seed must be an integer >= 0, got {args.seed}")
    if args.size < 32 or args.size % 16:
        raise UserError(f"--size must be a multiple of 16 and at least 32, got {args.size}")

    out = Path(args.output).resolve()
    print(announcement(args.schedule, out, kvasir=bool(args.kvasir)))
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = nnunet_environment(out)
    env.setdefault("nnUNet_def_n_proc", "2")
    # with the run seed and batches made in-process, the same command gives the same models and table on a CPU
    env[SEED_ENVIRONMENT_VARIABLE] = str(args.seed)
    env.setdefault(DATA_AUGMENTATION_PROCESSES_VARIABLE, "0")
    start = time.time()

    print(f"[1/5] dataset -> {out / 'nnUNet_raw'}")
    if args.kvasir:
        dataset_id = "502"
        _run(["nnUNetv2_meddisseg_convert", "kvasir-seg", args.kvasir, "-d", dataset_id, "--resize",
              str(args.size), "--overwrite"], env, logs)
    else:
        from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

        dataset_id = "501"
        make_synthetic_dataset(env["nnUNet_raw"], dataset_id=int(dataset_id), num_train=24, num_test=10,
                               size=args.size, seed=0, overwrite=True)
    print("[2/5] nnU-Net planning and preprocessing, Med-DisSeg plan")
    _run(["nnUNetv2_plan_and_preprocess", "-d", dataset_id, "-c", "2d", "-np", "2"], planning_environment(env), logs)
    _run(["nnUNetv2_meddisseg_plan", "-d", dataset_id], env, logs)
    print(f"[3/5] training default nnU-Net ({baseline_trainer})")
    _run(["nnUNetv2_train", dataset_id, "2d", "0", "-tr", baseline_trainer, "-device", args.device], env, logs)
    print(f"[4/5] training Med-DisSeg ({meddisseg_trainer}: Stage I then Stage II)")
    _run(["nnUNetv2_train", dataset_id, "2d", "0", "-tr", meddisseg_trainer, "-p", PLANS, "-device", args.device],
         env, logs)
    print("[5/5] predicting the test set with both and comparing")
    comparison = out / "comparison"
    _run(["nnUNetv2_meddisseg_compare", "-d", dataset_id, "-f", "0", "--baseline_trainer", baseline_trainer,
          "--trainer", meddisseg_trainer, "--plans", PLANS, "-o", str(comparison), "--device", args.device,
          "--names", "nnU-Net", "Med-DisSeg"], env, logs)
    table = comparison / "comparison.md"
    if table.is_file():
        from nnunetv2_meddisseg.evaluation.compare_predictions import terminal_text

        print("\n" + terminal_text(table.read_text()))
    print(f"Finished in {(time.time() - start) / 60:.1f} min. Comparison (table, chart, overlays): {comparison}")
    print(f"Report with the overlays of the cases that differ most: {table}")
    print("These are short demo schedules on a tiny dataset: the numbers show that the pipeline works, "
          "not which method is better.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command("nnUNetv2_meddisseg_demo", _demo, argv)


if __name__ == "__main__":
    sys.exit(main())
