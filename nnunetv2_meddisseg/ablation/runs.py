"""The runs of ``nnUNetv2_meddisseg_ablate``: budget trainers, one nnU-Net results folder per seed, and
one (variant, seed) run = ``nnUNetv2_train`` (resumed with ``--c``), ``nnUNetv2_predict`` on the test
images, evaluation against the test labels.

Layout of the output folder ``OUT``::

    OUT/settings.json                    the budget, plans and fold; a rerun must match them
    OUT/trainers/meddisseg_ablation_trainers.py   generated budget trainers (<variant>_ablation)
    OUT/seed_<s>/nnUNet_results/         nnUNet_results of every run with run seed s
    OUT/seed_<s>/predictions/<variant>/  the test-set predictions
    OUT/seed_<s>/runs/<variant>.json     written last: the run is finished (metrics and times)
    OUT/logs/<variant>_seed<s>_{train,predict}.log
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.training import budget_trainers
from nnunetv2_meddisseg.training.budget_trainers import Budget
from nnunetv2_meddisseg.evaluation.evaluate import evaluate_folders

__all__ = ["TRAINER_MODULE", "BUDGET_SUFFIX", "Budget", "write_budget_trainers", "AblationRun"]

TRAINER_MODULE = "meddisseg_ablation_trainers"
BUDGET_SUFFIX = "_ablation"
PACKAGE_TRAINER_FOLDER = Path(__file__).resolve().parent.parent / "nnunet_trainers"

def write_budget_trainers(folder: Path, variants: Mapping[str, str], budget: Budget) -> Path:
    """Write ``folder/meddisseg_ablation_trainers.py``: ``<variant>_ablation`` subclassing each variant
    (``variants``: trainer name -> importable module) with ``budget``; returns the file."""
    return budget_trainers.write_budget_trainers(folder / f"{TRAINER_MODULE}.py", variants, BUDGET_SUFFIX, budget,
                                                 "nnUNetv2_meddisseg_ablate evaluates the test set")


def _training_seconds(checkpoint_file: Path) -> float:
    """Sum of nnU-Net's epoch durations recorded in a checkpoint (survives interruptions and ``--c``)."""
    import torch

    logging = torch.load(checkpoint_file, map_location="cpu", weights_only=False)["logging"]
    return float(sum(end - start for start, end in zip(logging["epoch_start_timestamps"],
                                                        logging["epoch_end_timestamps"])))


@dataclass
class AblationRun:
    """Everything the runs of one output folder share."""

    out: Path
    dataset_name: str
    fold: str
    plans: str
    device: str
    images: Path  #: the raw dataset's imagesTs
    labels: Path  #: the raw dataset's labelsTs
    label_values: Dict[str, int]
    disable_tta: bool = False
    predict_processes: int = 2  #: nnUNetv2_predict's -npp and -nps

    def environment(self, seed: int) -> dict:
        env = dict(os.environ)
        env["nnUNet_results"] = str(self.out / f"seed_{seed}" / "nnUNet_results")
        env["nnUNet_meddisseg_seed"] = str(seed)
        user_folders = [f for f in os.environ.get("nnUNet_extTrainer", "").split(os.pathsep) if f.strip()]
        env["nnUNet_extTrainer"] = os.pathsep.join([str(self.out / "trainers"), str(PACKAGE_TRAINER_FOLDER),
                                                    *user_folders])
        return env

    def fold_folder(self, variant: str, seed: int) -> Path:
        return (self.out / f"seed_{seed}" / "nnUNet_results" / self.dataset_name
                / f"{variant}{BUDGET_SUFFIX}__{self.plans}__2d" / f"fold_{self.fold}")

    def record_file(self, variant: str, seed: int) -> Path:
        return self.out / f"seed_{seed}" / "runs" / f"{variant}.json"

    def state(self, variant: str, seed: int) -> str:
        """'finished', 'trained' (to predict), 'interrupted' (to resume with --c) or 'new'."""
        if self.record_file(variant, seed).is_file():
            return "finished"
        folder = self.fold_folder(variant, seed)
        if (folder / "checkpoint_final.pth").is_file():
            return "trained"
        return "interrupted" if (folder / "checkpoint_latest.pth").is_file() else "new"

    def _command(self, command: List[str], seed: int, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            proc = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]],
                                  env=self.environment(seed), stdout=f, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise UserError(f"'{' '.join(command)}' failed with exit code {proc.returncode}: "
                            f"{lines[-1] if lines else '(no output)'} (full log: {log})")

    def train(self, variant: str, seed: int) -> None:
        command = ["nnUNetv2_train", self.dataset_name, "2d", self.fold, "-tr", f"{variant}{BUDGET_SUFFIX}",
                   "-p", self.plans, "-device", self.device]
        if self.state(variant, seed) == "interrupted":
            command.append("--c")
        self._command(command, seed, self.out / "logs" / f"{variant}_seed{seed}_train.log")

    def predict_and_evaluate(self, variant: str, seed: int) -> dict:
        predictions = self.out / f"seed_{seed}" / "predictions" / variant
        command = ["nnUNetv2_predict", "-i", str(self.images), "-o", str(predictions), "-d", self.dataset_name,
                   "-c", "2d", "-f", self.fold, "-tr", f"{variant}{BUDGET_SUFFIX}", "-p", self.plans,
                   "-device", self.device, "-npp", str(self.predict_processes),
                   "-nps", str(self.predict_processes)]
        if self.disable_tta:
            command.append("--disable_tta")
        start = time.monotonic()
        self._command(command, seed, self.out / "logs" / f"{variant}_seed{seed}_predict.log")
        predict_seconds = time.monotonic() - start
        summary = evaluate_folders(str(self.labels), str(predictions), self.label_values, progress=False)
        record = {"variant": variant, "seed": seed, "predict_seconds": predict_seconds,
                  "train_seconds": _training_seconds(self.fold_folder(variant, seed) / "checkpoint_final.pth"),
                  "summary": summary}
        target = self.record_file(variant, seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".json.partial")
        partial.write_text(json.dumps(record, indent=1))
        os.replace(partial, target)
        return record

    def load_record(self, variant: str, seed: int) -> dict:
        return json.loads(self.record_file(variant, seed).read_text())
