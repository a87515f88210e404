"""``SeededTrainer``: nnU-Net's ``nnUNetTrainer`` with its initial weights and every epoch seeded from a run
seed (``seeding``) and its schedule (epochs, iterations, checkpoint period, final validation, torch threads)
from the trainer's recipe (``recipe``) and the overrides of ``nnUNet_meddisseg_recipe``."""
import os
from typing import List, Optional

import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from torch import distributed as dist

from nnunetv2_meddisseg.environment import RECIPE_ENVIRONMENT_VARIABLE, SEED_ENVIRONMENT_VARIABLE
from nnunetv2_meddisseg.training.recipe import ScheduleRecipe, recipe_overrides_from_environment, recipe_summary
from nnunetv2_meddisseg.training.seeding import run_seed_from_environment, seed_epoch

__all__ = ["SeededTrainer"]


class SeededTrainer(nnUNetTrainer):
    """nnUNetTrainer whose initial weights and every epoch are seeded from a run seed (``seed_epoch``), with
    its schedule from a recipe (``recipe``; ``nnUNetTrainerBaseline``: default nnU-Net, seeded).

    The run seed is the ``seed`` attribute, else ``nnUNet_meddisseg_seed``, else drawn at random. With the
    batches made in this process (``nnUNet_n_proc_DA=0``) and deterministic arithmetic (CPU), the same run
    seed gives the same run.
    """

    #: run seed; None: ``nnUNet_meddisseg_seed`` if set, else random (``seeding``)
    seed: Optional[int] = None
    #: the settings of this trainer class (``recipe``); ``self.recipe`` is the instance's, overrides applied
    recipe: ScheduleRecipe = ScheduleRecipe()

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.recipe = recipe_overrides_from_environment(self._class_recipe())
        self._apply_schedule()
        seed = self.seed if self.seed is not None else run_seed_from_environment()
        self.run_seed: int = int(seed) if seed is not None else int.from_bytes(os.urandom(4), "little")
        if self.is_ddp:  # one run seed for all processes (each draws its own random seed otherwise)
            shared = [self.run_seed]
            dist.broadcast_object_list(shared, src=0)
            self.run_seed = int(shared[0])

    def _class_recipe(self) -> ScheduleRecipe:
        """The recipe before the override file: the class's (subclasses adapt it to the plans)."""
        return type(self).recipe

    def _apply_schedule(self) -> None:
        """nnU-Net's schedule attributes from ``self.recipe`` (None keeps nnU-Net's)."""
        recipe = self.recipe
        for attribute, value in (("num_epochs", recipe.num_epochs),
                                 ("num_iterations_per_epoch", recipe.iterations_per_epoch),
                                 ("num_val_iterations_per_epoch", recipe.val_iterations_per_epoch),
                                 ("save_every", recipe.save_every)):
            if value is not None:
                setattr(self, attribute, value)
        if recipe.torch_threads is not None:
            # process-wide, but the process is this run's: nnUNetv2_train starts in nnU-Net's code, which sets no
            # thread count, so the recipe is where a run (benchmarks/quality.py's --threads) chooses one
            torch.set_num_threads(recipe.torch_threads)

    def initialize(self) -> None:
        if not self.was_initialized:
            seed_epoch(self.run_seed, None, self.local_rank)  # the initial weights depend on the run seed only
        super().initialize()

    def on_train_start(self) -> None:
        super().on_train_start()
        self.print_to_log_file(f"run seed {self.run_seed} (every epoch is seeded from it and the epoch number; "
                               f"set {SEED_ENVIRONMENT_VARIABLE} to fix it)")
        overrides = os.environ.get(RECIPE_ENVIRONMENT_VARIABLE, "").strip()
        self.print_to_log_file(f"recipe {type(self.recipe).__name__}: {recipe_summary(self.recipe)}"
                               + (f" (overrides from {overrides})" if overrides else ""))

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        """nnU-Net's final validation, unless the recipe's ``final_validation`` is False."""
        if not self.recipe.final_validation:
            self.print_to_log_file("final validation skipped (recipe setting final_validation false)")
            return
        super().perform_actual_validation(save_probabilities)

    def on_epoch_start(self) -> None:
        super().on_epoch_start()
        seed_epoch(self.run_seed, self.current_epoch, self.local_rank)

    def on_train_epoch_end(self, train_outputs: List[dict]) -> None:
        super().on_train_epoch_end(train_outputs)
        if self.device.type == "cuda":  # what a user sizes the plans' batch by (nnUNetv2_meddisseg_plan)
            peak = torch.cuda.max_memory_allocated(self.device) / 1024 ** 3
            self.print_to_log_file(f"peak GPU memory {peak:.2f} GiB (batch {self.batch_size})")
