"""``ExtendedTrainerBase``: what our trainers (``nnUNetTrainerMedDisSeg``, ``nnUNetTrainerDispersive``, the
seeded baselines and their variants) add to nnU-Net's ``nnUNetTrainer``, whatever their network and losses. Each
override calls nnU-Net's method and adds to it; the pieces of nnU-Net that have no smaller hook (the checkpoint's
entries, ``train_step``'s autocast rule and update, ``get_dataloaders``' training loader) are restated in
``nnunet_copies`` alone, pinned to nnU-Net's source by a test.

- Checkpoints are nnU-Net's plus the run seed and the subclasses' state (``_checkpoint_extras`` /
  ``_restore_checkpoint_extras``), written atomically (a temporary file in the same folder, then
  ``os.replace``), so a kill during a save never leaves a truncated ``checkpoint_latest.pth``. Epochs
  for which ``_may_write_best_checkpoint`` is False neither write ``checkpoint_best.pth`` nor count
  towards the best EMA pseudo Dice.
- Every training and validation batch is checked for NaN / inf: a clear ``RuntimeError`` naming the
  cases instead of a NaN model. On the CPU, and for validation batches, before the batch reaches the
  network. A training batch on any other device is checked there, and the result travels with the
  step's logged values (``_step_result``), so that a step synchronises with the device once: the
  error is raised at the end of the step that saw the batch, which stops the run before any
  checkpoint holds that step's update (``input_check_on_device`` chooses explicitly).
- A batch of one sample is reported once (a dispersive loss has no pairs and is zero), and at start-up
  a batch too small for the dispersive form (``MINIMUM_BATCH``) is named in one line of the log.
- Under DDP (``-num_gpus N``) the dispersive loss and its diagnostics see the batch of every process
  (``dispersive_gather``, ``losses.gather``); rank 0's run seed is the run seed of every process, so
  each rank draws its own, reproducible random numbers (``seed_epoch``); a batch with NaN / inf names
  the rank that loaded it.
- Per-epoch curves of every loss term, each group's learning rate and gradient norm, the dispersion
  diagnostics, logged through nnU-Net's logger (``self.logger.log``; its local logger is a ``CurvesLogger``
  that accepts them), so that they reach every logger nnU-Net drives (Weights & Biases with
  ``nnUNet_wandb_enabled=1``) and its ``logging`` checkpoint entry; plotted into ``progress_terms.png``
  beside nnU-Net's ``progress.png`` (``curves``). The diagnostics are computed on the first training batch
  of each epoch (``_dispersion_diagnostics``).
- Every setting comes from the trainer's recipe (``recipe``): the class attribute ``recipe``, then the
  overrides of the JSON file named by ``nnUNet_meddisseg_recipe`` (``recipe.recipe_overrides_from_environment``),
  held as ``trainer.recipe``; its schedule (epochs, iterations, checkpoint period, final validation, torch
  threads) is applied at construction and the log names every setting that differs from the defaults.
- ``initialize`` and every epoch start by seeding Python's, NumPy's and torch's global generators
  from ``(run seed, epoch, rank)``. The run seed is the trainer's ``seed`` attribute, else the environment
  variable ``nnUNet_meddisseg_seed``, else drawn at random; checkpoints store it. An epoch is then a
  function of the weights and optimizer state it starts from, so ``--c`` replays the rest of an
  interrupted run exactly where the batches come from this process (``nnUNet_n_proc_DA=0``) and the
  arithmetic is deterministic (CPU; see docs/method.md, "Exact resumption", for what differs otherwise).
- With the environment variable ``nnUNet_meddisseg_bf16`` set (a flag: "1", "true", "yes", ...), training and
  validation steps run under bfloat16 autocast without a GradScaler (on CUDA and on the CPU), instead
  of nnU-Net's fp16 autocast + GradScaler on CUDA and fp32 on the CPU. bf16 has fp32's exponent range,
  so no loss scaling is needed and no value leaves its range. Prediction is unaffected.
"""
import math
import os
import tempfile
from contextlib import contextmanager
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.utilities.collate_outputs import collate_outputs
from torch import autocast, nn
from torch import distributed as dist

from nnunetv2_meddisseg.environment import BF16_ENVIRONMENT_VARIABLE, bf16_training_requested
from nnunetv2_meddisseg.losses import DIAGNOSTIC_KEYS, MINIMUM_BATCH, dispersion_diagnostics, gather_batch
from nnunetv2_meddisseg.module_wrappers import unwrap_module
from nnunetv2_meddisseg.training.checkpoints import atomic_torch_save, read_checkpoint_for_resuming
from nnunetv2_meddisseg.training.curves import PLOT_FILENAME, CurvesLogger, TrainingCurves
from nnunetv2_meddisseg.training.errors import TrainingInputError, TrainingInputRuntimeError
from nnunetv2_meddisseg.training.finite_input import check_finite_input, finite_per_sample, non_finite_input_message
from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step, checkpoint_entries, train_autocast
from nnunetv2_meddisseg.training.seeded_trainer import SeededTrainer

__all__ = ["CURVE_PREFIXES", "ExtendedTrainerBase"]


#: train_step output keys with these prefixes are averaged per epoch and logged (``self.logger.log``)
CURVE_PREFIXES = ("loss_", "dispersion_", "grad_norm_")


class ExtendedTrainerBase(SeededTrainer):
    """SeededTrainer + atomic checkpoints, input checks, per-epoch curves (see the module docstring).

    Not meant to be used on its own (its network and losses are nnU-Net's); subclasses override
    ``_checkpoint_extras`` / ``_restore_checkpoint_extras`` / ``_before_restoring_checkpoint`` and
    ``_stage_boundaries`` as needed and return ``loss_*`` / ``dispersion_*`` floats from ``train_step``.
    """

    #: under DDP, the dispersive loss and its diagnostics use the batch of every process (False: each
    #: process's own share, as without gathering)
    dispersive_gather: bool = True
    #: check training batches for NaN / inf on the device, read at the step's one transfer to the host
    #: (True), or before the step (False); None: on the device everywhere but on the CPU
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
        self._warned_small_batch = False
        self._diagnostics_due = True
        #: (the true ``_best_ema``,) while ``_best_checkpoint_withheld`` holds it back, else None
        self._withheld_best_ema: Optional[Tuple[object]] = None
        #: (finite flags on the device, case keys, where) of the training batch not yet checked on the host
        self._pending_input_check: Optional[Tuple[torch.Tensor, Optional[Sequence[str]], str]] = None

    # ------------------------------------------------------------------ helpers
    @property
    def curves(self) -> TrainingCurves:
        """Our per-epoch curves as the logger holds them (read them here; log through ``self.logger.log``)."""
        return self.logger.local_logger.curves()

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
        """Check ``batch['data']`` for NaN / inf (naming the cases; a training batch on the device, its
        result read by ``_step_result``), warn once about single-sample batches, and move data and
        target to the device."""
        data, target = batch["data"], batch["target"]
        where = self._batch_description(training)
        on_device = self.input_check_on_device
        on_device = training and (self.device.type != "cpu" if on_device is None else on_device)
        if not on_device:
            check_finite_input(data, batch.get("keys"), where)
        gathered = self.is_ddp and self.dispersive_gather
        if training and data.shape[0] < 2 and not gathered and not self._warned_small_batch:
            self._warned_small_batch = True
            self.print_to_log_file("WARNING: a training batch holds a single sample: the dispersive loss needs at "
                                   "least two samples and is zero for such batches. Use a batch size >= 2 in the "
                                   "plans to get dispersion regularisation.")
        data = data.to(self.device, non_blocking=True)
        if on_device:
            self._pending_input_check = (finite_per_sample(data), batch.get("keys"), where)
        if isinstance(target, list):
            target = [t.to(self.device, non_blocking=True) for t in target]
        else:
            target = target.to(self.device, non_blocking=True)
        return data, target

    def validation_step(self, batch: dict) -> dict:
        """nnU-Net's ``validation_step``, after checking ``batch['data']`` for NaN / inf (naming the cases)."""
        check_finite_input(batch["data"], batch.get("keys"), self._batch_description(training=False))
        return super().validation_step(batch)

    def _trained_parameters(self) -> List[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _group_gradient_norms(self) -> Dict[str, torch.Tensor]:
        """``{"grad_norm_<group name>": L2 norm}`` of every optimizer group's gradients (before clipping),
        0-dim fp32 tensors on the device (multi-tensor norms: a few operations per group, no sync)."""
        norms: Dict[str, torch.Tensor] = {}
        for i, group in enumerate(self.optimizer.param_groups):
            grads = [p.grad.detach() for p in group["params"] if p.grad is not None]
            if grads:
                name = group.get("name", "network" if len(self.optimizer.param_groups) == 1 else i)
                per_tensor = torch._foreach_norm(grads)
                norms[f"grad_norm_{name}"] = torch.linalg.vector_norm(torch.stack(per_tensor).float())
        return norms

    def _optimizer_step(self, loss: torch.Tensor) -> Dict[str, torch.Tensor]:
        """nnU-Net's update (``backward_clip_step``: backward, gradient clipping at 12 and step, with its
        GradScaler on CUDA) of every parameter the optimizer holds. Returns each group's gradient norm
        before clipping (``_group_gradient_norms``, on the device; inf / NaN in a step that the GradScaler
        skips)."""
        return backward_clip_step(loss, self.optimizer, self.grad_scaler, self._trained_parameters(),
                                  before_clipping=self._group_gradient_norms)

    def _step_result(self, total: torch.Tensor, scalars: Mapping[str, torch.Tensor]) -> dict:
        """A ``train_step`` result from one device-to-host transfer: ``loss`` (total, a 0-dim array as
        nnU-Net's), every 0-dim tensor of ``scalars`` as a float under its name, and the finiteness flags
        of the step's batch (``_batch_to_device``), which raise the input error naming the cases here."""
        names = list(scalars)
        parts = [total.detach().float().reshape(1)] + [scalars[n].detach().float().reshape(1) for n in names]
        check, self._pending_input_check = self._pending_input_check, None
        if check is not None:
            parts.append(check[0].float())
        host = torch.cat(parts).cpu().numpy()
        if check is not None:
            finite = host[1 + len(names):] > 0
            if not finite.all():
                raise TrainingInputRuntimeError(non_finite_input_message(finite.tolist(), check[1], check[2]))
        result = {"loss": np.array(host[0])}
        result.update({n: float(v) for n, v in zip(names, host[1:1 + len(names)])})
        return result

    def on_train_start(self) -> None:
        super().on_train_start()
        if self.bf16:
            self.print_to_log_file(f"{BF16_ENVIRONMENT_VARIABLE} is set: bf16 autocast, no GradScaler")
        warning = self._dispersive_batch_warning()
        if warning:
            self.print_to_log_file(warning)

    def _dispersive_batch_size(self) -> int:
        """The samples one dispersive loss sees: the global batch where it is gathered over the processes,
        else the smallest share of one process (nnU-Net splits a batch of 5 over 2 GPUs into 3 + 2)."""
        global_batch = self.configuration_manager.batch_size
        if not self.is_ddp:
            return self.batch_size
        return global_batch if self.dispersive_gather else global_batch // dist.get_world_size()

    def _dispersive_batch_warning(self) -> Optional[str]:
        """One line for the log when the dispersive form (``dispersive_variant``) needs a larger batch."""
        variant = getattr(self.recipe, "dispersive_variant", None)
        needed = MINIMUM_BATCH.get(variant, 2)
        size = self._dispersive_batch_size()
        if size >= needed:
            return None
        local = self.is_ddp and not self.dispersive_gather
        where = " per process (dispersive_gather is off)" if local else ""
        plans_batch = needed * (dist.get_world_size() if local else 1)
        return (f"WARNING: the dispersive loss ({variant}) sees {size} sample(s) per step{where} but needs at least "
                f"{needed}: it is a constant without gradient and does not regularise. Use a batch size >= "
                f"{plans_batch} in the plans" + (", or the infonce_cosine form (nnUNetTrainerDispersive_cosine)"
                                   if variant == "infonce_cosine_centred" else "") + ".")

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self._diagnostics_due = True

    def _dispersion_diagnostics(self, features: torch.Tensor) -> Dict[str, float]:
        """``dispersion_*`` entries of a ``train_step`` result: ``dispersion_diagnostics(features)`` on the
        first training step of each epoch, NaN on the others (the epoch's curve is the mean of the finite
        values), so that their cost is paid once per epoch."""
        if not self._diagnostics_due:
            return {f"dispersion_{k}": math.nan for k in DIAGNOSTIC_KEYS}
        self._diagnostics_due = False
        if self.is_ddp and self.dispersive_gather:
            features = gather_batch(features.detach())
        return {f"dispersion_{k}": v for k, v in dispersion_diagnostics(features).items()}

    # ------------------------------------------------------------------ curves
    def _stage_boundaries(self) -> Sequence[int]:
        return ()

    def _warn_if_no_step_learned(self, outputs: Dict[str, np.ndarray]) -> None:
        """Log a warning when no training step of the epoch had a finite, non-zero gradient (``outputs``:
        the collated ``train_step`` results, one value per step under each ``grad_norm_*`` key).

        That is a run that has stopped learning, e.g. under fp16 when the GradScaler has shrunk its scale
        until every gradient underflows; its curves would otherwise only flatten."""
        norms = [np.asarray(v, dtype=np.float64).reshape(-1) for k, v in outputs.items() if k.startswith("grad_norm_")]
        if not norms or np.any(np.isfinite(norms := np.concatenate(norms)) & (norms > 0)):
            return
        scaler = f" (GradScaler scale {self.grad_scaler.get_scale():.3g})" if self.grad_scaler is not None else ""
        self.print_to_log_file(
            f"WARNING: no training step of epoch {self.current_epoch} changed the weights: every gradient was zero "
            f"or not finite{scaler}. The run has stopped learning; see docs/troubleshooting.md.")

    def on_train_epoch_end(self, train_outputs: List[dict]) -> None:
        super().on_train_epoch_end(train_outputs)
        outputs = collate_outputs(train_outputs)
        means: Dict[str, float] = {}
        for key, values in outputs.items():
            if key.startswith(CURVE_PREFIXES):
                finite = [v for v in values if np.isfinite(v)]
                means[key] = float(np.mean(finite)) if finite else float("nan")
        if self.is_ddp:
            gathered: List[Optional[Dict[str, float]]] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, means)
            means = {k: float(np.nanmean([g.get(k, np.nan) for g in gathered])) for k in means}
        for key, value in means.items():
            self.logger.log(key, value, self.current_epoch)
        terms = ", ".join(f"{k[len('loss_'):]} {v:.4f}" for k, v in sorted(means.items()) if k.startswith("loss_"))
        if terms:
            self.print_to_log_file(f"loss terms: {terms}")
        gradient_norms = {k: v for k, v in means.items() if k.startswith("grad_norm_")}
        if gradient_norms:
            self.print_to_log_file("gradient norms (before clipping): " + ", ".join(
                f"{k[len('grad_norm_'):]} {v:.4g}" for k, v in sorted(gradient_norms.items())))
        diagnostics = {k: v for k, v in means.items() if k.startswith("dispersion_")}
        if diagnostics:
            self.print_to_log_file("dispersion: " + ", ".join(f"{k[len('dispersion_'):]} {v:.4g}"
                                                              for k, v in sorted(diagnostics.items())))
        self._warn_if_no_step_learned(outputs)

    # ------------------------------------------------------------------ end of epoch, checkpoint_best
    def _may_write_best_checkpoint(self) -> bool:
        """Whether this epoch's network may become ``checkpoint_best.pth`` (when its EMA pseudo Dice is the
        best so far). Epochs for which this is False neither write it nor count towards the best EMA."""
        return True

    def _restart_ema_fg_dice(self) -> None:
        """Restart nnU-Net's EMA pseudo Dice at the current epoch: its value becomes this epoch's pseudo
        Dice, so that later epochs average only from here on. Call after ``on_validation_epoch_end``."""
        epoch = self.current_epoch
        dice, ema = self.logger.get_value("mean_fg_dice", step=None), self.logger.get_value("ema_fg_dice", step=None)
        if len(dice) != epoch + 1 or len(ema) != epoch + 1:
            raise RuntimeError(f"cannot restart the EMA pseudo Dice at epoch {epoch}: the logger holds "
                               f"{len(dice)} pseudo Dice values")
        self.logger.log("ema_fg_dice", dice[epoch], epoch)

    @contextmanager
    def _best_checkpoint_withheld(self, withheld: bool):
        """Within the block, no EMA pseudo Dice is a new best (nnU-Net's ``on_epoch_end`` then neither writes
        ``checkpoint_best.pth`` nor moves ``_best_ema``); checkpoints written meanwhile hold the true ``_best_ema``."""
        if not withheld:
            yield
            return
        best, self._withheld_best_ema = self._best_ema, (self._best_ema,)
        self._best_ema = math.inf  # nnU-Net: a new best where "_best_ema is None or ema > _best_ema"
        try:
            yield
        finally:
            self._best_ema, self._withheld_best_ema = best, None

    def on_epoch_end(self) -> None:
        """nnU-Net's ``on_epoch_end`` (log, periodic ``checkpoint_latest.pth``, ``checkpoint_best.pth`` on a new
        best EMA pseudo Dice, ``progress.png``) with ``checkpoint_best.pth`` subject to
        ``_may_write_best_checkpoint``, our curves given NaN where an epoch logged none, plus ``progress_terms.png``."""
        epoch = self.current_epoch
        self.logger.local_logger.fill_missing(epoch)  # one value per epoch in every list, NaN where none came
        with self._best_checkpoint_withheld(not self._may_write_best_checkpoint()):
            super().on_epoch_end()
        if self.local_rank == 0:
            self.curves.plot(join(self.output_folder, PLOT_FILENAME), num_epochs=epoch + 1,
                             stage_boundaries=self._stage_boundaries())

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_extras(self) -> Dict[str, object]:
        return {}

    def _before_restoring_checkpoint(self, checkpoint: Mapping[str, object]) -> None:
        """Called by ``load_checkpoint`` after ``initialize`` and before any state is restored."""

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        """Called by ``load_checkpoint`` after nnU-Net's state (network, optimizer, ...) is restored."""

    def save_checkpoint(self, filename: str) -> None:
        """nnU-Net's checkpoint (``checkpoint_entries``) + ``run_seed`` + ``_checkpoint_extras``, written atomically."""
        if self.local_rank != 0 or self.disable_checkpointing:
            super().save_checkpoint(filename)  # nnU-Net writes nothing then
            return
        checkpoint = checkpoint_entries(self)
        if self._withheld_best_ema is not None:
            checkpoint["_best_ema"] = self._withheld_best_ema[0]
        checkpoint["run_seed"] = self.run_seed
        checkpoint.update(self._checkpoint_extras())
        atomic_torch_save(checkpoint, filename)

    def load_checkpoint(self, filename_or_checkpoint: Union[dict, str]) -> None:
        """nnU-Net's ``load_checkpoint``, with ``_before_restoring_checkpoint`` before it and the run seed, curves
        of older checkpoints (``training_curves``) and ``_restore_checkpoint_extras`` after it."""
        if not self.was_initialized:
            self.initialize()
        if not isinstance(filename_or_checkpoint, str):
            # nnU-Net 2.8.1's load_checkpoint reads a file name only: hand it the checkpoint as a file
            with tempfile.TemporaryDirectory() as folder:
                filename = os.path.join(folder, "checkpoint.pth")
                torch.save(filename_or_checkpoint, filename)
                self.load_checkpoint(filename)
            return
        # our entries, read lazily (memory-mapped, tensors are read when used) and with weights_only=True, so
        # that a checkpoint carrying code is refused before nnU-Net reads its own entries
        checkpoint = read_checkpoint_for_resuming(filename_or_checkpoint)
        try:
            self._before_restoring_checkpoint(checkpoint)
        except TrainingInputError as error:  # the hook's message does not know the file
            raise type(error)(f"checkpoint {filename_or_checkpoint}: {error}") from None
        super().load_checkpoint(filename_or_checkpoint)
        if checkpoint.get("training_curves"):  # checkpoints that keep the curves in an entry of their own
            self.logger.local_logger.adopt(checkpoint["training_curves"])
        if checkpoint.get("run_seed") is not None:
            self.run_seed = int(checkpoint["run_seed"])
        self._restore_checkpoint_extras(checkpoint)
