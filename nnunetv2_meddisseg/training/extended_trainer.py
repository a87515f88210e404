"""``ExtendedTrainerBase``: what our trainers (``nnUNetTrainerMedDisSeg``, ``nnUNetTrainerDispersive`` and their
variants) add to nnU-Net's ``nnUNetTrainer`` (through ``SeededTrainer``: the run seed and the recipe), whatever their
network and losses. Each override calls nnU-Net's method and adds to it; the pieces of nnU-Net that have no smaller
hook (the checkpoint's entries, ``train_step``'s autocast rule and update, ``get_dataloaders``' training loader,
``on_epoch_end``) are restated in ``nnunet_copies``, pinned to nnU-Net's source by a test (and nnU-Net's deep
supervision loss per output in ``losses/segmentation.py``). Each concept lives
in a module of its own; the class holds them and overrides each hook once:

- the dispersive loss of the recipe (``recipe.dispersive_from_recipe``, ``trainer.dispersive``): under DDP
  (``-num_gpus N``) it and its diagnostics see the batch of every process (``dispersive_gather``); the diagnostics
  of each epoch's first batch and the warnings about batches too small for it: ``dispersion_monitor``;
- what a training step reports, in one transfer from the device: ``step_report`` (the loss, the terms, each group's
  gradient norm, and the NaN / inf check of its batch). Every training and validation batch is checked for NaN /
  inf: a clear ``RuntimeError`` naming the cases instead of a NaN model. On the CPU, and for validation batches,
  before the batch reaches the network; a training batch on any other device is checked there and read with the
  step's report, so that the error is raised at the end of the step that saw the batch, before any checkpoint holds
  its update (``input_check_on_device`` chooses explicitly; ``finite_input``); under DDP the message names the rank;
- per-epoch curves (every loss term, each group's learning rate and gradient norm, the dispersion diagnostics)
  through nnU-Net's logger (its local logger is a ``CurvesLogger`` that accepts them), so that they reach every
  logger nnU-Net drives (Weights & Biases with ``nnUNet_wandb_enabled=1``) and its ``logging`` checkpoint entry;
  averaged over ranks under DDP, summarised in the log and plotted into ``progress_terms.png`` beside nnU-Net's
  ``progress.png`` (``curves``);
- one rule for ``checkpoint_best.pth`` (``best_checkpoint_from``: the networks of epochs from it on may become it,
  against an EMA pseudo Dice that starts afresh there; subclasses set it when a stage is entered);
- checkpoints: nnU-Net's plus the run seed and the subclasses' state (``_checkpoint_extras`` /
  ``_restore_checkpoint_extras``), written whole (``checkpoints``), so a kill during a save never leaves a truncated
  ``checkpoint_latest.pth``;
- precision: with ``nnUNet_meddisseg_bf16`` set (a flag: "1", "true", "yes", ...), training and validation steps run
  under bfloat16 autocast without a GradScaler (on CUDA and on the CPU), instead of nnU-Net's fp16 autocast +
  GradScaler on CUDA and fp32 on the CPU. bf16 has fp32's exponent range, so no loss scaling is needed. Prediction
  is unaffected.
"""
import os
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.utilities.collate_outputs import collate_outputs
from torch import autocast, nn
from torch import distributed as dist

from nnunetv2_meddisseg.environment import BF16_ENVIRONMENT_VARIABLE, bf16_training_requested
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
from nnunetv2_meddisseg.training.finite_input import check_finite_input
from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step, checkpoint_entries, epoch_end, train_autocast
from nnunetv2_meddisseg.training.recipe import DispersiveTermRecipe, dispersive_from_recipe
from nnunetv2_meddisseg.training.seeded_trainer import SeededTrainer
from nnunetv2_meddisseg.training.step_report import PendingInputCheck, group_gradient_norms, step_report

__all__ = ["ExtendedTrainerBase"]


class ExtendedTrainerBase(SeededTrainer):
    """SeededTrainer + the dispersive loss, step reports with input checks, per-epoch curves, one best-checkpoint
    rule and whole checkpoints (see the module docstring).

    Not meant to be used on its own; subclasses compute their loss in ``train_step`` (``_batch_to_device``,
    ``_autocast``, ``_optimizer_step``, ``_step_report``) and override ``_checkpoint_extras`` /
    ``_restore_checkpoint_extras`` / ``_before_restoring_checkpoint``, ``_epoch_end_checkpoints`` and
    ``_stage_boundaries`` as needed.
    """

    recipe: DispersiveTermRecipe = DispersiveTermRecipe()
    #: under DDP, the dispersive loss and its diagnostics use the batch of every process (False: each
    #: process's own share, as without gathering)
    dispersive_gather: bool = True
    #: check training batches for NaN / inf on the device, read with the step's report (True), or before the step
    #: (False); None: on the device everywhere but on the CPU
    input_check_on_device: Optional[bool] = None

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        #: bf16 autocast without a GradScaler (``nnUNet_meddisseg_bf16``; not on MPS, which lacks it)
        self.bf16 = bf16_training_requested() and self.device.type in ("cuda", "cpu")
        if self.bf16:
            self.grad_scaler = None
        # nnU-Net's local logger (plots, checkpoint) accepting our curves too; MetaLogger sends them on
        self.logger.local_logger = CurvesLogger(self.logger.local_logger.verbose)
        #: the (unweighted) dispersive loss of the recipe, over the batch of every process (``dispersive_gather``)
        self.dispersive = dispersive_from_recipe(self.recipe, self.dispersive_gather)
        self._diagnostics = EpochDiagnostics(self.dispersive)
        #: the one rule of ``checkpoint_best.pth``: the networks of epochs from this one on may become it, against an
        #: EMA pseudo Dice that starts afresh at it; None: no network of the current stage may (subclasses set it
        #: when a stage is entered)
        self.best_checkpoint_from: Optional[int] = 0
        self._warned_single_sample = False
        #: the input check of the training batch not yet read (``_batch_to_device`` -> ``_step_report``)
        self._pending_input_check: Optional[PendingInputCheck] = None

    # ------------------------------------------------------------------ a training step
    def _plain_network(self) -> nn.Module:
        return unwrap_module(self.network)

    def _autocast(self):
        """nnU-Net's rule (``train_autocast``: autocast on CUDA only); bf16 autocast on CUDA and the CPU with
        ``nnUNet_meddisseg_bf16`` set."""
        if self.bf16:
            return autocast(self.device.type, dtype=torch.bfloat16, enabled=True)
        return train_autocast(self.device)

    def _batch_description(self, training: bool) -> str:
        rank = f" on rank {self.local_rank}" if self.is_ddp else ""
        return f" in a {'training' if training else 'validation'} batch of epoch {self.current_epoch}{rank}"

    def _batch_to_device(self, batch: dict, training: bool) -> Tuple[torch.Tensor, Union[torch.Tensor, List]]:
        """Check ``batch['data']`` for NaN / inf (naming the cases; a training batch on the device, read with the
        step's report), warn once about single-sample batches, and move data and target to the device."""
        data, target = batch["data"], batch["target"]
        where = self._batch_description(training)
        on_device = self.input_check_on_device
        on_device = training and (self.device.type != "cpu" if on_device is None else on_device)
        if not on_device:
            check_finite_input(data, batch.get("keys"), where)
        gathered = self.is_ddp and self.dispersive_gather
        if training and data.shape[0] < 2 and not gathered and not self._warned_single_sample:
            self._warned_single_sample = True
            self.print_to_log_file(SINGLE_SAMPLE_WARNING)
        data = data.to(self.device, non_blocking=True)
        if on_device:
            self._pending_input_check = PendingInputCheck.of(data, batch.get("keys"), where)
        if isinstance(target, list):
            target = [t.to(self.device, non_blocking=True) for t in target]
        else:
            target = target.to(self.device, non_blocking=True)
        return data, target

    def _optimizer_step(self, loss: torch.Tensor) -> Dict[str, torch.Tensor]:
        """nnU-Net's update (``backward_clip_step``: backward, gradient clipping at 12 and step, with its
        GradScaler on CUDA) of every parameter the optimizer holds. Returns each group's gradient norm
        before clipping (``step_report.group_gradient_norms``, on the device; inf / NaN in a step that the
        GradScaler skips)."""
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        return backward_clip_step(loss, self.optimizer, self.grad_scaler, parameters,
                                  before_clipping=lambda: group_gradient_norms(self.optimizer))

    def _step_report(self, total: torch.Tensor, terms: Mapping[str, torch.Tensor],
                     gradient_norms: Mapping[str, torch.Tensor], features: torch.Tensor) -> dict:
        """The ``train_step`` result: ``step_report`` of the loss, each (unweighted) term as ``loss_<name>``, the
        gradient norms and the batch's pending input check, in one transfer; plus the dispersion diagnostics of
        ``features`` (the first regularised layer) on the epoch's first step."""
        check, self._pending_input_check = self._pending_input_check, None
        result = step_report(total, {**{f"loss_{k}": v for k, v in terms.items()}, **gradient_norms}, check)
        result.update(self._diagnostics(features))
        return result

    def validation_step(self, batch: dict) -> dict:
        """nnU-Net's ``validation_step``, after checking ``batch['data']`` for NaN / inf (naming the cases)."""
        check_finite_input(batch["data"], batch.get("keys"), self._batch_description(training=False))
        return super().validation_step(batch)

    # ------------------------------------------------------------------ start of training, epochs
    def on_train_start(self) -> None:
        super().on_train_start()
        if self.bf16:
            self.print_to_log_file(f"{BF16_ENVIRONMENT_VARIABLE} is set: bf16 autocast, no GradScaler")
        warning = self._small_batch_warning()
        if warning:
            self.print_to_log_file(warning)

    def _small_batch_warning(self) -> Optional[str]:
        """``dispersion_monitor.small_batch_warning`` for the samples one dispersive loss sees: the global batch
        where it is gathered over the processes, else the smallest share of one process (nnU-Net splits a batch of
        5 over 2 GPUs into 3 + 2)."""
        if not self.is_ddp:
            return small_batch_warning(self.recipe.dispersive_variant, self.batch_size)
        global_batch, world_size = self.configuration_manager.batch_size, dist.get_world_size()
        samples = global_batch if self.dispersive_gather else global_batch // world_size
        return small_batch_warning(self.recipe.dispersive_variant, samples, not self.dispersive_gather, world_size)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self._diagnostics.new_epoch()

    def on_train_epoch_end(self, train_outputs: List[dict]) -> None:
        """nnU-Net's, then the epoch's mean of each of our curves (averaged over ranks under DDP) logged and
        summarised in the log, and a warning where no step of the epoch changed the weights."""
        super().on_train_epoch_end(train_outputs)
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
        """nnU-Net's, with its EMA pseudo Dice started afresh at ``best_checkpoint_from``: there it is that epoch's
        pseudo Dice, so that the EMA of later epochs averages only from there on."""
        super().on_validation_epoch_end(val_outputs)
        epoch = self.current_epoch
        if epoch > 0 and epoch == self.best_checkpoint_from:
            self.logger.log("ema_fg_dice", self.logger.get_value("mean_fg_dice", step=epoch), epoch)

    # ------------------------------------------------------------------ end of epoch
    def _stage_boundaries(self) -> Sequence[int]:
        """Epochs at which a new training stage starts (the plot's dashed lines)."""
        return ()

    def _epoch_end_checkpoints(self, epoch: int) -> List[str]:
        """Checkpoint files written at the end of ``epoch`` besides nnU-Net's periodic ``checkpoint_latest.pth``."""
        return []

    def on_epoch_end(self) -> None:
        """nnU-Net's ``on_epoch_end`` (``nnunet_copies.epoch_end``: log, periodic ``checkpoint_latest.pth`` and
        ``_epoch_end_checkpoints``, ``checkpoint_best.pth`` on a new best EMA pseudo Dice of an epoch from
        ``best_checkpoint_from`` on, ``progress.png``), our curves given NaN where an epoch logged none, plus
        ``progress_terms.png``."""
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
        """nnU-Net's checkpoint (``checkpoint_entries``) + ``run_seed`` + ``_checkpoint_extras``, written whole
        (``checkpoints.save_checkpoint_file``)."""
        if self.local_rank != 0 or self.disable_checkpointing:
            super().save_checkpoint(filename)  # nnU-Net writes nothing then
            return
        checkpoint = checkpoint_entries(self)
        checkpoint["run_seed"] = self.run_seed
        checkpoint.update(self._checkpoint_extras())
        save_checkpoint_file(checkpoint, filename)

    def load_checkpoint(self, filename_or_checkpoint: Union[dict, str]) -> None:
        """nnU-Net's ``load_checkpoint``, with ``_before_restoring_checkpoint`` before it and the run seed and
        ``_restore_checkpoint_extras`` after it. A file is read once, weights-only (memory-mapped, tensors read when
        used): a checkpoint carrying code is refused before nnU-Net reads it."""
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
        # nnU-Net 2.8.1's load_checkpoint reads a file name only (with weights_only=False): a private copy of what
        # was read weights-only
        with tempfile.TemporaryDirectory() as folder:
            copy = os.path.join(folder, "checkpoint.pth")
            torch.save(checkpoint, copy)
            super().load_checkpoint(copy)
        if checkpoint.get("run_seed") is not None:
            self.run_seed = int(checkpoint["run_seed"])
        self._restore_checkpoint_extras(checkpoint)
