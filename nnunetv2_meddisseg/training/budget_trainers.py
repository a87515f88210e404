"""Trainer subclasses with a fixed training budget, generated as a module for ``nnUNet_extTrainer``.

``nnUNetv2_meddisseg_ablate`` and ``benchmarks/quality.py`` train several trainers for the same
budget through the real ``nnUNetv2_train``. nnU-Net sets a schedule in a trainer's ``__init__``
(``nnUNetTrainer_250epochs`` etc.), so each gets a subclass ``<trainer><suffix>`` in a generated
module that sets the number of epochs, iterations per epoch and validation iterations (``None``
keeps the trainer's own), optionally skips nnU-Net's final validation and sets torch's thread count.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["Budget", "write_budget_trainers"]

_MODULE_TEMPLATE = '''"""Trainers with a fixed budget ({purpose}): generated, rewritten by every run.

Epochs: {epochs} (None: each trainer's own); iterations per epoch: {iterations}; validation iterations per
epoch: {val_iterations} (None: the trainer's); nnU-Net's final validation {final_text}; torch threads: {threads}.
"""
import torch
{imports}

NUM_EPOCHS = {epochs}
ITERATIONS_PER_EPOCH = {iterations}
VAL_ITERATIONS_PER_EPOCH = {val_iterations}
FINAL_VALIDATION = {final_validation}
TORCH_THREADS = {threads}


def _budget(trainer) -> None:
    if NUM_EPOCHS is not None:
        trainer.num_epochs = NUM_EPOCHS
    if ITERATIONS_PER_EPOCH is not None:
        trainer.num_iterations_per_epoch = ITERATIONS_PER_EPOCH
    if VAL_ITERATIONS_PER_EPOCH is not None:
        trainer.num_val_iterations_per_epoch = VAL_ITERATIONS_PER_EPOCH
    if TORCH_THREADS is not None:
        torch.set_num_threads(TORCH_THREADS)
{classes}'''

_CLASS_TEMPLATE = '''

class {name}{suffix}({name}):
    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        _budget(self)

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        if FINAL_VALIDATION:
            super().perform_actual_validation(save_probabilities)
        else:
            self.print_to_log_file("final validation skipped ({purpose})")
'''


@dataclass(frozen=True)
class Budget:
    """The training budget every trainer gets (None: the trainer's own value)."""

    epochs: Optional[int] = None
    iterations_per_epoch: Optional[int] = None
    val_iterations: Optional[int] = None
    final_validation: bool = False
    torch_threads: Optional[int] = None


def write_budget_trainers(target: Path, trainers: Mapping[str, str], suffix: str, budget: Budget,
                          purpose: str) -> Path:
    """Write the module ``target`` (a ``.py`` file) with ``<name><suffix>`` subclassing each trainer of
    ``trainers`` (class name -> importable module) with ``budget``; ``purpose`` names the caller in the
    module's docstring and log lines. Returns ``target``."""
    imports = "\n".join(sorted(f"from {module} import {name}" for name, module in trainers.items()))
    classes = "".join(_CLASS_TEMPLATE.format(name=name, suffix=suffix, purpose=purpose) for name in trainers)
    text = _MODULE_TEMPLATE.format(imports=imports, classes=classes, epochs=budget.epochs, purpose=purpose,
                                   iterations=budget.iterations_per_epoch, val_iterations=budget.val_iterations,
                                   final_validation=budget.final_validation, threads=budget.torch_threads,
                                   final_text="runs" if budget.final_validation else "is skipped")
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target
