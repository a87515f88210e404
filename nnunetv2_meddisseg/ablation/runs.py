"""The runs of ``nnUNetv2_meddisseg_ablate``: one (variant, seed) run is ``nnUNetv2_train`` (resumed with
``--c``), ``nnUNetv2_predict`` on the test images and evaluation against the test labels. Every variant trains
on a copy of its plans holding the budget as recipe overrides (``<plans>_budget_<digest>.json``).

Layout of the output folder ``OUT``::

    OUT/settings.json                    the budget, plans and fold; a rerun must match them
    OUT/seed_<s>/nnUNet_results/         nnUNet_results of every run with run seed s
    OUT/seed_<s>/predictions/<variant>/  the test-set predictions
    OUT/seed_<s>/runs/<variant>.json     written last: the run is finished (metrics and times)
    OUT/logs/<variant>_seed<s>_{train,predict}.log
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from nnunetv2_meddisseg.environment import SEED_ENVIRONMENT_VARIABLE, set_nnunet_environment
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.evaluation.evaluate import evaluate_folders
from nnunetv2_meddisseg.files import write_atomically
from nnunetv2_meddisseg.logged_command import run_logged
from nnunetv2_meddisseg.plans_architecture import architecture_entry
from nnunetv2_meddisseg.training.recipe import RECIPE_PLANS_KEY

__all__ = ["NETWORK_ABLATIONS", "Variant", "budget_plans_name", "write_budget_plans", "write_network_ablation_plans",
           "epoch_seconds", "AblationRun"]

#: the paper's network ablations: name -> the MedDisSegNet ``arch_kwargs`` it changes
NETWORK_ABLATIONS: Dict[str, dict] = {"noELAT": {"elat": False}, "ReLU": {"activation": "relu"},
                                      "noCBAT": {"cbat": False}}


@dataclass(frozen=True)
class Variant:
    """One arm of the ablation: a trainer class name and the plans it trains on."""

    trainer: str
    plans: str


def _read_plans(preprocessed: Path, plans: str) -> dict:
    source = preprocessed / f"{plans}.json"
    if not source.is_file():
        raise UserError(f"{source} not found: plan and preprocess the dataset with these plans first (-p)")
    return json.loads(source.read_text())


def _write_plans(preprocessed: Path, name: str, content: dict) -> str:
    content["plans_name"] = name
    write_atomically(preprocessed / f"{name}.json", lambda partial: partial.write_text(json.dumps(content, indent=4)))
    return name


def budget_plans_name(plans: str, recipe: Mapping[str, object]) -> str:
    """``<plans>_budget_<digest>``: the name of the plans ``plans`` with the recipe overrides ``recipe``."""
    return f"{plans}_budget_{hashlib.sha256(json.dumps(dict(recipe), sort_keys=True).encode()).hexdigest()[:8]}"


def write_budget_plans(preprocessed: Path, plans: str, budget: Mapping[str, object]) -> str:
    """Write ``<plans>_budget_<digest>.json``: ``plans`` with ``budget`` merged over its recipe overrides; the
    digest names the settings, so budgets never share a file. Return the new plans name."""
    content = _read_plans(preprocessed, plans)
    content[RECIPE_PLANS_KEY] = recipe = {**content.get(RECIPE_PLANS_KEY, {}), **budget}
    return _write_plans(preprocessed, budget_plans_name(plans, recipe), content)


def write_network_ablation_plans(preprocessed: Path, plans: str, ablation: str) -> str:
    """Write ``<plans>_<ablation>.json``: MedDisSegNet's ``arch_kwargs`` changed by ``NETWORK_ABLATIONS[ablation]``;
    another network gets the default MedDisSegNet, as ``nnUNetTrainerMedDisSeg`` builds it. Return the new name."""
    content = _read_plans(preprocessed, plans)
    for configuration in content.get("configurations", {}).values():
        architecture = configuration.get("architecture")
        if architecture is None:
            continue
        if str(architecture.get("network_class_name", "")).endswith("MedDisSegNet"):
            architecture["arch_kwargs"].update(NETWORK_ABLATIONS[ablation])
        else:
            configuration["architecture"] = architecture_entry(**NETWORK_ABLATIONS[ablation])
    return _write_plans(preprocessed, f"{plans}_{ablation}", content)


def epoch_seconds(checkpoint_file: Path) -> List[float]:
    """nnU-Net's epoch durations recorded in a checkpoint, one per epoch (survive interruptions and ``--c``)."""
    from nnunetv2_meddisseg.torch_files import read_checkpoint

    logging = read_checkpoint(checkpoint_file)["logging"]
    return [float(end - start) for start, end in zip(logging["epoch_start_timestamps"],
                                                     logging["epoch_end_timestamps"])]


@dataclass
class AblationRun:
    """Everything the runs of one output folder share."""

    out: Path
    dataset_name: str
    fold: str
    variants: Dict[str, Variant]  #: name -> trainer and plans
    device: str
    images: Path  #: the raw dataset's imagesTs
    labels: Path  #: the raw dataset's labelsTs
    label_values: Dict[str, int]
    disable_tta: bool = False
    predict_processes: int = 2  #: nnUNetv2_predict's -npp and -nps

    def environment(self, seed: int) -> dict:
        env = set_nnunet_environment(dict(os.environ))
        env["nnUNet_results"] = str(self.out / f"seed_{seed}" / "nnUNet_results")
        env[SEED_ENVIRONMENT_VARIABLE] = str(seed)
        return env

    def fold_folder(self, variant: str, seed: int) -> Path:
        spec = self.variants[variant]
        return (self.out / f"seed_{seed}" / "nnUNet_results" / self.dataset_name
                / f"{spec.trainer}__{spec.plans}__2d" / f"fold_{self.fold}")

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

    def _command(self, command: List[str], seed: int, log: Path, time_limit_s: Optional[float] = None) -> None:
        """Run ``command`` in ``seed``'s environment, appending to ``log``; UserError or CommandStopped (timed out)."""
        run_logged(command, self.environment(seed), log, echo=False, append=True, timeout_s=time_limit_s)

    def train(self, variant: str, seed: int, time_limit_s: Optional[float] = None) -> None:
        """Train (``--c`` after an interruption); past ``time_limit_s``: ``CommandStopped``, last checkpoint kept."""
        spec = self.variants[variant]
        command = ["nnUNetv2_train", self.dataset_name, "2d", self.fold, "-tr", spec.trainer, "-p", spec.plans,
                   "-device", self.device]
        if self.state(variant, seed) == "interrupted":
            command.append("--c")
        self._command(command, seed, self.out / "logs" / f"{variant}_seed{seed}_train.log", time_limit_s)

    def predict_and_evaluate(self, variant: str, seed: int, time_limit_s: Optional[float] = None) -> dict:
        from nnunetv2_meddisseg.torch_files import check_model_folder_checkpoints

        spec = self.variants[variant]
        fold_folder = self.fold_folder(variant, seed)
        predictions = self.out / f"seed_{seed}" / "predictions" / variant
        command = ["nnUNetv2_predict", "-i", str(self.images), "-o", str(predictions), "-d", self.dataset_name,
                   "-c", "2d", "-f", self.fold, "-tr", spec.trainer, "-p", spec.plans, "-device", self.device,
                   "-npp", str(self.predict_processes), "-nps", str(self.predict_processes)]
        if self.disable_tta:
            command.append("--disable_tta")
        # nnUNetv2_predict loads the checkpoint with weights_only=False: read it weights-only first
        check_model_folder_checkpoints(fold_folder.parent, [self.fold], "checkpoint_final.pth")
        start = time.monotonic()
        self._command(command, seed, self.out / "logs" / f"{variant}_seed{seed}_predict.log", time_limit_s)
        predict_seconds = time.monotonic() - start
        summary = evaluate_folders(str(self.labels), str(predictions), self.label_values, progress=False)
        epochs = epoch_seconds(fold_folder / "checkpoint_final.pth")
        record = {"variant": variant, "seed": seed, "predict_seconds": predict_seconds,
                  "train_seconds": float(sum(epochs)), "epoch_seconds": epochs, "summary": summary}
        target = self.record_file(variant, seed)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, lambda partial: partial.write_text(json.dumps(record, indent=1)))
        return record

    def load_record(self, variant: str, seed: int) -> dict:
        return json.loads(self.record_file(variant, seed).read_text())
