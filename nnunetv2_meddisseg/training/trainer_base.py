"""``TrainerBase``: what our trainers add to ``nnUNetTrainer``, whatever their network and losses. Each override calls
nnU-Net's method and adds to it; parts with no smaller hook are restated in ``nnunet_copies``, pinned by a test.

- run seed and recipe: the initial weights and every epoch are seeded from a run seed (``seeding``); the schedule
  comes from the recipe and the plans' overrides (``nnUNetTrainerBaseline`` has this part only);
- the recipe's dispersive loss; under DDP it and its diagnostics see every process's batch (``dispersive_gather``);
- NaN / inf input checks: a ``RuntimeError`` naming the cases instead of a NaN model. Training batches off the CPU are
  checked on the device with the step's report: the error comes after that step, before a checkpoint holds its update;
- per-epoch curves through nnU-Net's logger (so W&B and the checkpoint's ``logging`` get them), averaged over ranks,
  summarised in the log, plotted in ``progress_terms.png``;
- ``checkpoint_best.pth`` only from ``best_checkpoint_from`` on, against an EMA pseudo Dice restarted there;
- checkpoints with the run seed and the subclass's state, written whole: a kill never truncates one;
- ``nnUNet_meddisseg_bf16``: bf16 autocast without a GradScaler (CUDA and CPU; bf16 has fp32's exponent range)
  instead of nnU-Net's fp16 + GradScaler on CUDA and fp32 on the CPU. Prediction is unaffected.
"""
import os
import tempfile
from functools import partial
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.utilities.collate_outputs import collate_outputs
from nnunetv2.utilities.helpers import dummy_context
from torch import autocast, nn
from torch import distributed as dist

from nnunetv2_meddisseg.environment import (
    BF16_ENVIRONMENT_VARIABLE,
    SEED_ENVIRONMENT_VARIABLE,
    bf16_training_requested,
)
from nnunetv2_meddisseg.module_wrappers import unwrap_module
from nnunetv2_meddisseg.training.checkpoints import read_checkpoint_for_resuming, save_checkpoint_file
from nnunetv2_meddisseg.training.curves import (
    PLOT_FILENAME,
    CurvesLogger,
    epoch_means,
    plot_curves,
    stopped_learning,
    summary_lines,
)
from nnunetv2_meddisseg.training.dispersion_monitor import SINGLE_SAMPLE_WARNING, EpochDiagnostics, small_batch_warning
from nnunetv2_meddisseg.training.errors import TrainingInputError
from nnunetv2_meddisseg.training.finite_input import check_finite_input, finite_per_sample
from nnunetv2_meddisseg.training.nnunet_copies import checkpoint_entries, epoch_end
from nnunetv2_meddisseg.training.recipe import (
    RECIPE_PLANS_KEY,
    DispersiveTermRecipe,
    ScheduleRecipe,
    dispersive_from_recipe,
    recipe_from_plans,
    recipe_summary,
)
from nnunetv2_meddisseg.training.seeding import run_seed_from_environment, seed_epoch
from nnunetv2_meddisseg.training.step_report import PendingInputCheck

__all__ = ["TrainerBase", "set_up_run", "run_lines", "peak_memory_line", "final_validation_skipped"]


def set_up_run(trainer: nnUNetTrainer, class_recipe: ScheduleRecipe) -> None:
    """Set ``trainer.recipe`` (``class_recipe`` + the plans' overrides), nnU-Net's schedule and ``trainer.run_seed``."""
    recipe = trainer.recipe = recipe_from_plans(class_recipe, trainer.plans_manager.plans)
    for attribute, value in (("num_epochs", recipe.num_epochs),
                             ("num_iterations_per_epoch", recipe.iterations_per_epoch),
                             ("num_val_iterations_per_epoch", recipe.val_iterations_per_epoch),
                             ("save_every", recipe.save_every)):
        if value is not None:
            setattr(trainer, attribute, value)
    if recipe.torch_threads is not None:
        # replaces nnUNetv2_train's count (all cores on the CPU, 1 on CUDA), e.g. for two runs side by side
        torch.set_num_threads(recipe.torch_threads)
    seed = trainer.seed if trainer.seed is not None else run_seed_from_environment()
    trainer.run_seed = int(seed) if seed is not None else int.from_bytes(os.urandom(4), "little")
    if trainer.is_ddp:  # one run seed for all processes (each draws its own random seed otherwise)
        shared = [trainer.run_seed]
        dist.broadcast_object_list(shared, src=0)
        trainer.run_seed = int(shared[0])


def run_lines(trainer: nnUNetTrainer) -> List[str]:
    """The log's lines on the run seed and the recipe at the start of training."""
    overrides = RECIPE_PLANS_KEY in trainer.plans_manager.plans
    return [f"run seed {trainer.run_seed} (every epoch is seeded from it and the epoch number; set "
            f"{SEED_ENVIRONMENT_VARIABLE} to fix it)",
            f"recipe {type(trainer.recipe).__name__}: {recipe_summary(trainer.recipe)}"
            + (f" (overrides from the plans' {RECIPE_PLANS_KEY})" if overrides else "")]


def peak_memory_line(trainer: nnUNetTrainer) -> Optional[str]:
    """The peak GPU memory of the run so far, what a user sizes the plans' batch by; None off CUDA."""
    if trainer.device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(trainer.device) / 1024 ** 3
    return f"peak GPU memory {peak:.2f} GiB (batch {trainer.batch_size})"


def final_validation_skipped(trainer: nnUNetTrainer) -> bool:
    """Whether the recipe's ``final_validation`` is False (the log says so)."""
    if trainer.recipe.final_validation:
        return False
    trainer.print_to_log_file("final validation skipped (recipe setting final_validation false)")
    return True


class TrainerBase(nnUNetTrainer):
    """nnU-Net's trainer + the module docstring's list. With batches made in this process (``nnUNet_n_proc_DA=0``) and
    deterministic arithmetic (CPU), a run seed repeats its run. Subclasses own ``train_step`` and ``validation_step``
    and override the empty hooks."""

    #: run seed; None: ``nnUNet_meddisseg_seed`` if set, else random (``seeding``)
    seed: Optional[int] = None
    #: the settings of this trainer class (``recipe``); ``self.recipe`` is the instance's, overrides applied
    recipe: DispersiveTermRecipe = DispersiveTermRecipe()
    #: under DDP, the dispersive loss and its diagnostics see the batch of every process (False: its own share)
    dispersive_gather: bool = True
    #: check training batches on the device with the step's report (True) or before the step (False); None: off CPU
    input_check_on_device: Optional[bool] = None

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        set_up_run(self, type(self).recipe)
        #: bf16 autocast without a GradScaler (``nnUNet_meddisseg_bf16``; not on MPS, which lacks it)
        self.bf16 = bf16_training_requested() and self.device.type in ("cuda", "cpu")
        if self.bf16:
            self.grad_scaler = None
            self.autocast = autocast(self.device.type, dtype=torch.bfloat16, enabled=True)
        elif self.device.type == "cuda":
            self.autocast = autocast(self.device.type, enabled=True)
        else:
            self.autocast = dummy_context()
        # nnU-Net's local logger (plots, checkpoint) accepting our curves too; MetaLogger sends them on
        self.logger.local_logger = CurvesLogger(self.logger.local_logger.verbose)
        #: the (unweighted) dispersive loss of the recipe, over the batch of every process (``dispersive_gather``)
        self.dispersive = dispersive_from_recipe(self.recipe, self.dispersive_gather)
        self._diagnostics = EpochDiagnostics(self.dispersive)
        #: epochs from this one on may become ``checkpoint_best.pth`` (their EMA pseudo Dice restarts here); None: none
        self.best_checkpoint_from: Optional[int] = 0
        self._warned_single_sample = False
        # the error messages' "where", formatted only for a batch with NaN / inf
        self._training_batch, self._validation_batch = (partial(self._batch_description, True),
                                                        partial(self._batch_description, False))

    def _plain_network(self) -> nn.Module:
        return unwrap_module(self.network)

    # ------------------------------------------------------------------ set-up
    def _check_run_settings(self) -> None:
        """Called by ``initialize`` before nnU-Net's: raise for settings the trainer cannot train."""

    def _set_up_training(self) -> None:
        """Called by ``initialize`` after nnU-Net's (network, loss, optimizer, DDP)."""

    def initialize(self) -> None:
        self._check_run_settings()
        if not self.was_initialized:
            seed_epoch(self.run_seed, None, self.local_rank)  # the initial weights depend on the run seed only
        super().initialize()
        self._set_up_training()

    def _train_start_lines(self) -> List[str]:
        """The subclass's lines of the log at the start of training."""
        return []

    def on_train_start(self) -> None:
        super().on_train_start()
        lines = run_lines(self)
        if self.bf16:
            lines.append(f"{BF16_ENVIRONMENT_VARIABLE} is set: bf16 autocast, no GradScaler")
        lines.append(self._small_batch_warning())
        for line in lines + self._train_start_lines():
            if line:
                self.print_to_log_file(line)

    def _small_batch_warning(self) -> Optional[str]:
        """``small_batch_warning`` for the samples one dispersive loss sees: the global batch where gathered, else
        the smallest share of one process (nnU-Net splits a batch of 5 over 2 GPUs into 3 + 2)."""
        if not self.is_ddp:
            return small_batch_warning(self.recipe.dispersive_variant, self.batch_size)
        global_batch, world_size = self.configuration_manager.batch_size, dist.get_world_size()
        samples = global_batch if self.dispersive_gather else global_batch // world_size
        return small_batch_warning(self.recipe.dispersive_variant, samples, not self.dispersive_gather, world_size)

    # ------------------------------------------------------------------ steps
    def _batch_description(self, training: bool) -> str:
        rank = f" on rank {self.local_rank}" if self.is_ddp else ""
        return f" in a {'training' if training else 'validation'} batch of epoch {self.current_epoch}{rank}"

    def _batch_to_device(self, batch: dict) -> Tuple[torch.Tensor, Union[torch.Tensor, List],
                                                     Optional[PendingInputCheck]]:
        """Data, target on the device and the input check to read with the step's report (None: checked here)."""
        data, target, keys = batch["data"], batch["target"], batch.get("keys")
        on_device = self.input_check_on_device
        on_device = self.device.type != "cpu" if on_device is None else on_device
        if not on_device:
            check_finite_input(data, keys, self._training_batch)
        if data.shape[0] < 2 and not (self.is_ddp and self.dispersive_gather) and not self._warned_single_sample:
            self._warned_single_sample = True
            self.print_to_log_file(SINGLE_SAMPLE_WARNING)
        data = data.to(self.device, non_blocking=True)
        check = PendingInputCheck(finite_per_sample(data), keys, self._training_batch) if on_device else None
        if isinstance(target, list):
            target = [t.to(self.device, non_blocking=True) for t in target]
        else:
            target = target.to(self.device, non_blocking=True)
        return data, target, check

    def _check_validation_batch(self, batch: dict) -> None:
        """``batch['data']`` checked for NaN / inf (naming the cases)."""
        check_finite_input(batch["data"], batch.get("keys"), self._validation_batch)

    def _run_final_validation(self, validate: Callable[[bool], None], save_probabilities: bool) -> None:
        """Runs the final validation (``validate``); subclasses run it their way."""
        validate(save_probabilities)

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        """nnU-Net's final validation via ``_run_final_validation``, unless the recipe's ``final_validation`` is off."""
        self._run_final_validation(self._final_validation, save_probabilities)

    def _final_validation(self, save_probabilities: bool) -> None:
        if not final_validation_skipped(self):
            super().perform_actual_validation(save_probabilities)

    # ------------------------------------------------------------------ epochs
    def on_epoch_start(self) -> None:
        super().on_epoch_start()
        seed_epoch(self.run_seed, self.current_epoch, self.local_rank)
        self._diagnostics.new_epoch()

    def on_train_epoch_end(self, train_outputs: List[dict]) -> None:
        """nnU-Net's, the peak GPU memory, our curves' epoch means, and a warning where no step changed the weights."""
        super().on_train_epoch_end(train_outputs)
        peak = peak_memory_line(self)
        if peak:
            self.print_to_log_file(peak)
        outputs = collate_outputs(train_outputs)
        means = epoch_means(outputs)
        if self.is_ddp:
            gathered: List[Optional[Dict[str, float]]] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, means)
            means = {k: float(np.nanmean([g.get(k, np.nan) for g in gathered])) for k in means}
        for key, value in means.items():
            self.logger.log(key, value, self.current_epoch)
        for line in summary_lines(means):
            self.print_to_log_file(line)
        if stopped_learning(outputs):  # e.g. fp16, the GradScaler's scale shrunk until every gradient underflows
            scaler = f" (GradScaler scale {self.grad_scaler.get_scale():.3g})" if self.grad_scaler is not None else ""
            self.print_to_log_file(
                f"WARNING: no training step of epoch {self.current_epoch} changed the weights: every gradient was "
                f"zero or not finite{scaler}. The run has stopped learning; see docs/troubleshooting.md.")

    def on_validation_epoch_end(self, val_outputs) -> None:
        """nnU-Net's, with the EMA pseudo Dice restarted at ``best_checkpoint_from`` (set to that epoch's Dice)."""
        super().on_validation_epoch_end(val_outputs)
        epoch = self.current_epoch
        if epoch > 0 and epoch == self.best_checkpoint_from:
            self.logger.log("ema_fg_dice", self.logger.get_value("mean_fg_dice", step=epoch), epoch)

    def _stage_boundaries(self) -> Sequence[int]:
        """Epochs at which a new training stage starts (the plot's dashed lines)."""
        return ()

    def _epoch_end_checkpoints(self, epoch: int) -> List[str]:
        """Checkpoint files written at the end of ``epoch`` besides nnU-Net's periodic ``checkpoint_latest.pth``."""
        return []

    def on_epoch_end(self) -> None:
        """``nnunet_copies.epoch_end`` (our checkpoints, best from ``best_checkpoint_from``), ``progress_terms.png``."""
        epoch, first_best = self.current_epoch, self.best_checkpoint_from
        self.logger.local_logger.fill_missing(epoch)  # one value per epoch in every list, NaN where none came
        epoch_end(self, self._epoch_end_checkpoints(epoch), may_become_best=first_best is not None and
                  epoch >= first_best)
        if self.local_rank == 0:
            plot_curves(self.logger.local_logger.my_fantastic_logging, join(self.output_folder, PLOT_FILENAME),
                        num_epochs=epoch + 1, stage_boundaries=self._stage_boundaries())

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_extras(self) -> Dict[str, object]:
        return {}

    def _before_restoring_checkpoint(self, checkpoint: Mapping[str, object]) -> None:
        """Called by ``load_checkpoint`` after ``initialize`` and before any state is restored."""

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        """Called by ``load_checkpoint`` after nnU-Net's state (network, optimizer, ...) is restored."""

    def save_checkpoint(self, filename: str) -> None:
        """nnU-Net's checkpoint + ``run_seed`` + ``_checkpoint_extras``, written whole."""
        if self.local_rank != 0 or self.disable_checkpointing:
            super().save_checkpoint(filename)  # nnU-Net writes nothing then
            return
        checkpoint = {**checkpoint_entries(self), "run_seed": self.run_seed, **self._checkpoint_extras()}
        save_checkpoint_file(checkpoint, filename)

    def load_checkpoint(self, filename_or_checkpoint: Union[dict, str]) -> None:
        """nnU-Net's, between ``_before_restoring_checkpoint`` and the run seed and ``_restore_checkpoint_extras``.
        A file is read once, weights-only and memory-mapped: one carrying code is refused before nnU-Net reads it."""
        if not self.was_initialized:
            self.initialize()
        if isinstance(filename_or_checkpoint, str):
            checkpoint = read_checkpoint_for_resuming(filename_or_checkpoint)
            where = f"checkpoint {filename_or_checkpoint}: "
        else:
            checkpoint, where = filename_or_checkpoint, ""
        try:
            self._before_restoring_checkpoint(checkpoint)
        except TrainingInputError as error:  # the hook's message does not know the file
            raise type(error)(f"{where}{error}") from None
        # nnU-Net 2.8.1 loads only a file name (weights_only=False): give it a copy of what was read weights-only
        with tempfile.TemporaryDirectory() as folder:
            copy = os.path.join(folder, "checkpoint.pth")
            torch.save(checkpoint, copy)
            super().load_checkpoint(copy)
        if checkpoint.get("run_seed") is not None:
            self.run_seed = int(checkpoint["run_seed"])
        self._restore_checkpoint_extras(checkpoint)
