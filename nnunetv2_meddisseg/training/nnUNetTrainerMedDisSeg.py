"""nnUNetTrainerMedDisSeg: Med-DisSeg's two training stages in one ``nnUNetv2_train`` run."""
import inspect
import math
import os
from time import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch
from nnunetv2.utilities.helpers import empty_cache
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from nnunetv2_meddisseg.blocks.stage1_head import Stage1Head
from nnunetv2_meddisseg.environment import COMPILE_VARIABLE
from nnunetv2_meddisseg.training.batchnorm_statistics import recalibrate_batchnorm
from nnunetv2_meddisseg.training.compilation import Compilation, CompileDecision, compile_pays
from nnunetv2_meddisseg.training.errors import TrainingInputError, TrainingInputRuntimeError
from nnunetv2_meddisseg.training.lr_schedule import PerGroupPolyLRScheduler
from nnunetv2_meddisseg.training.network_from_plans import (
    build_meddisseg_network,
    load_plans_encoder_weights,
    plans_encoder_weights,
    plans_recording_the_network,
    require_2d_configuration,
)
from nnunetv2_meddisseg.training.nnunet_copies import training_dataloader, validation_counts
from nnunetv2_meddisseg.training.photometric import channels_are_rgb
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe
from nnunetv2_meddisseg.training.seeding import preserved_random_state, seed_generators
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2, Stage, Stage1, Stage2, checkpoint_stage
from nnunetv2_meddisseg.training.step_report import group_gradient_norms, step_report
from nnunetv2_meddisseg.training.trainer_base import TrainerBase

__all__ = ["nnUNetTrainerMedDisSeg"]


class nnUNetTrainerMedDisSeg(TrainerBase):
    """Med-DisSeg (ResNet-50 + ELAT encoder, CDFA, three CBAT decoders) trained in two stages.

    Settings are fields of ``recipe.MedDisSegRecipe`` (the paper's by default); what differs between the stages is
    ``self.stage`` (``training.stages``). Stage I, epochs ``[0, stage1_epochs)`` (250 of 1000 by default): encoder +
    ELAT with a light head, on clean and per-sample photometrically perturbed views as one batch of 2B; groups ``head``
    and ``encoder`` at ``stage1_lr``. Stage II, the rest: the full network, encoder + ELAT carried over, a new optimizer
    with ``encoder`` at ``stage2_encoder_lr`` and ``decoder`` at ``stage2_lr``. Every output is at full resolution, so
    nnU-Net's deep supervision stays off. Rates decay ``(1 - t) ** 0.9`` within each stage. The paper's rates assume an
    ImageNet encoder; they are kept for a random one because higher rates let the early features collapse under the
    uncentred dispersive loss (docs/method.md). ``dispersive_placement`` "late" is D_s's output in Stage II, the head's
    fused feature in Stage I. Diagnostics (mean pairwise d_ij, effective rank) use each epoch's first training batch.

    Checkpoints record their stage (Stage I ones also the head); ``--c`` resumes in it. The end of Stage I also writes
    ``checkpoint_latest.pth``. Only Stage II networks may become ``checkpoint_best.pth``; the EMA pseudo Dice restarts
    at the first Stage II epoch. torch.compile, where nnU-Net would compile and ``nnUNet_compile`` is unset, only if the
    schedule repays it (``compile_pays``); training steps only, static shapes, falling back to eager on a compile error.
    Under DDP the Stage I head has its own DDP and the idle decoder enters the loss with weight 0, so that DDP's reducer
    completes. Not supported: 3D configurations (``TrainingInputError`` at construction) and region-based labels.
    """

    recipe: MedDisSegRecipe = MedDisSegRecipe()
    #: the torch.compile backend (a name or a callable)
    compile_backend: Union[str, Callable] = "inductor"

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        require_2d_configuration(plans, configuration, self.__class__.__name__)
        plans = plans_recording_the_network(plans, configuration)
        super().__init__(plans, configuration, fold, dataset_json, device)
        # the stages' losses supervise every full-resolution output; nnU-Net's loss, targets, validation see one
        self.enable_deep_supervision = False
        self.initial_lr = self.recipe.stage2_lr
        #: the current epoch's stage; None until ``initialize``
        self.stage: Optional[Stage] = None
        # getattr_static: a function a variant declares as its backend stays a function, not a method of the trainer
        self.compilation = Compilation(inspect.getattr_static(self, "compile_backend"), self.print_to_log_file,
                                       lambda: self._set_network(self._plain_network()))
        self._compile_decision: Optional[CompileDecision] = None
        self._calibration_batches: Optional[List[Tensor]] = None
        #: weights were loaded into the network after ``initialize`` (nnU-Net's ``-pretrained_weights``, ``--c``)
        self._weights_loaded = False

    # ------------------------------------------------------------------ settings
    @property
    def stage1_epochs(self) -> int:
        """Epochs of Stage I: the recipe's ``stage1_epochs``, else ``floor(stage1_fraction * num_epochs)``."""
        if self.recipe.stage1_epochs is not None:
            return self.recipe.stage1_epochs
        return int(math.floor(self.recipe.stage1_fraction * self.num_epochs))

    @property
    def training_stage(self) -> Optional[str]:
        """The current stage's name (``STAGE_1`` / ``STAGE_2``), None before ``initialize``."""
        return None if self.stage is None else self.stage.name

    @property
    def stage1_head(self) -> Optional[nn.Module]:
        """The Stage I head (possibly DDP-wrapped) while the trainer is in Stage I, else None."""
        return getattr(self.stage, "head", None)

    @property
    def compiled(self) -> bool:
        return self.compilation.compiled

    def stage_for_epoch(self, epoch: int) -> str:
        return STAGE_1 if epoch < self.stage1_epochs else STAGE_2

    def _check_run_settings(self) -> None:
        """What this trainer cannot train: region-based labels, a Stage I longer than the run."""
        if self.label_manager.has_regions:
            raise TrainingInputError(f"{self.__class__.__name__} does not support region-based labels "
                                     f"(dataset.json 'regions_class_order')")
        if not 0 <= self.stage1_epochs <= self.num_epochs:
            raise TrainingInputError(f"{self.__class__.__name__}: the recipe's stage1_epochs must lie in [0, "
                                     f"num_epochs={self.num_epochs}], got {self.stage1_epochs}")

    # ------------------------------------------------------------------ the stages
    def _make_stage(self, name: str) -> Stage:
        """Stage ``name``: ``STAGE_1`` or ``STAGE_2`` (``stage_for_epoch`` and ``checkpoint_stage`` give no other)."""
        network, seg, dispersive = self._plain_network(), self.loss, self.dispersive
        if name == STAGE_1:
            return Stage1(network, self.recipe, seg, dispersive, 0, self.stage1_epochs, self._build_stage1_head(),
                          self._input_is_rgb(), distributed=self.is_ddp)
        return Stage2(network, self.recipe, seg, dispersive, self.stage1_epochs, self.num_epochs - self.stage1_epochs,
                      self.label_manager.ignore_label)

    def _enter_stage(self, name: str) -> None:
        """Make stage ``name`` current, with its optimizer, schedule and ``best_checkpoint_from``."""
        self.stage = self._make_stage(name)
        self.optimizer, self.lr_scheduler = self.configure_optimizers()
        #: the parameters ``train_step`` clips: every one the optimizer holds (the Stage I head too)
        self._clipped = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.best_checkpoint_from = self.stage.first_epoch if self.stage.trains_whole_network else None

    def _build_stage1_head(self) -> nn.Module:
        norm_op, norm_op_kwargs = self._plain_network().added_norm
        head = Stage1Head(self.label_manager.num_segmentation_heads, width=self.recipe.stage1_head_width,
                          norm_op=norm_op, norm_op_kwargs=norm_op_kwargs).to(self.device)
        self.compilation.compile_module(head)
        if self.is_ddp:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            head = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(head), device_ids=device_ids)
        return head

    def _input_is_rgb(self) -> bool:
        if self.recipe.photometric_rgb is not None:
            return bool(self.recipe.photometric_rgb)
        return channels_are_rgb(self.dataset_json, self.num_input_channels)

    def _lr_scheduler(self, optimizer: torch.optim.Optimizer, stage: Stage):
        """Each group's rate decays over the stage's epochs from its own base rate."""
        return PerGroupPolyLRScheduler(optimizer, [g["lr"] for g in optimizer.param_groups], stage.first_epoch,
                                       max(stage.num_epochs, 1), self.recipe.lr_exponent)

    def configure_optimizers(self):
        """The current stage's optimizer and schedule; (None, None) without a stage: nnU-Net's ``initialize`` asks
        before it builds the loss a stage needs, and entering the first stage asks again."""
        if self.stage is None:
            return None, None
        recipe, groups = self.recipe, self.stage.parameter_groups()
        if recipe.optimizer == "adam":
            # one fused kernel per step for all parameters on CUDA (same update as the for-each form)
            optimizer = torch.optim.Adam(groups, weight_decay=recipe.adam_weight_decay,
                                         fused=self.device.type == "cuda")
        else:
            optimizer = torch.optim.SGD(groups, momentum=recipe.sgd_momentum, nesterov=True,
                                        weight_decay=recipe.sgd_weight_decay)
        return optimizer, self._lr_scheduler(optimizer, self.stage)

    # ------------------------------------------------------------------ network, loss, set-up
    @staticmethod
    def build_network_architecture(plans_manager: PlansManager,
                                   configuration_manager: ConfigurationManager,
                                   num_input_channels: int,
                                   num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> nn.Module:
        """MedDisSegNet from the plans' ``arch_kwargs``, else ``nnUNetv2_meddisseg_plan``'s defaults; ``initialize``
        loads ``encoder_weights``: the predictor builds through it, then loads a checkpoint (the file may be absent)."""
        return build_meddisseg_network(configuration_manager, num_input_channels, num_output_channels,
                                       enable_deep_supervision)

    def _do_i_compile(self) -> bool:
        if self._compile_decision is None:
            self._compile_decision = self._decide_compilation()
            self.print_to_log_file(self._compile_decision.log_line())
        return self._compile_decision.compile

    def _decide_compilation(self) -> CompileDecision:
        """nnU-Net's answer where ``nnUNet_compile`` is set or nnU-Net would not compile, else ``compile_pays``."""
        nnunet_compiles, setting = super()._do_i_compile(), os.environ.get(COMPILE_VARIABLE)
        if setting is not None or not nnunet_compiles:
            reason = f"{COMPILE_VARIABLE}={setting}" if setting is not None else \
                f"nnU-Net does not compile on {self.device.type}"
            return CompileDecision(nnunet_compiles, reason)
        iterations = self.num_iterations_per_epoch
        stages = (self.stage1_epochs * iterations, (self.num_epochs - self.stage1_epochs) * iterations)
        patch = self.configuration_manager.patch_size
        return compile_pays(stages, self.batch_size, int(patch[0]) * int(patch[1]))

    def _set_up_training(self) -> None:
        """After nnU-Net's set-up: recompile with static shapes where nnU-Net compiled, load the plans' encoder
        weights (``--c`` or ``-pretrained_weights`` load theirs over them later), enter the current epoch's stage."""
        network = self._plain_network()
        if self._do_i_compile():
            if self.device.type == "cuda" and hasattr(network, "_use_channels_last"):
                network._use_channels_last()  # the layout the compiled graphs see (an eager forward sets it itself)
            self._set_network(self.compilation.compile(network))
        load_plans_encoder_weights(network, self.configuration_manager)
        network.register_load_state_dict_post_hook(self._note_loaded_weights)
        self._enter_stage(self.stage_for_epoch(self.current_epoch))

    def _set_network(self, network: nn.Module) -> None:
        if isinstance(self.network, DDP):
            self.network.module = network
        else:
            self.network = network

    def _note_loaded_weights(self, module: nn.Module, incompatible_keys) -> None:
        self._weights_loaded = True

    def _encoder_origin(self) -> str:
        """The encoder weights' origin; nnU-Net is silent on ``-pretrained_weights``: a load before epoch 0 tells."""
        if self._weights_loaded and self.current_epoch == 0:
            return "the weights -pretrained_weights loaded (every layer whose name and shape match)"
        weights = plans_encoder_weights(self.configuration_manager)
        return f"pretrained weights ({weights})" if weights else "random initialisation"

    # ------------------------------------------------------------------ training
    def _train_start_lines(self) -> List[str]:
        origin, recipe = self._encoder_origin(), self.recipe
        perturbation = "RGB" if self._input_is_rgb() else "channel-wise"
        lines = [f"encoder from {origin}: {recipe.optimizer}, learning rates Stage I {recipe.stage1_lr}, "
                 f"Stage II {recipe.stage2_encoder_lr} (encoder + ELAT) / {recipe.stage2_lr} (rest)",
                 f"Med-DisSeg: Stage I epochs 0-{self.stage1_epochs - 1}, Stage II epochs {self.stage1_epochs}-"
                 f"{self.num_epochs - 1}; dispersive {recipe.dispersive_variant} tau {recipe.dispersive_tau} at "
                 f"'{recipe.dispersive_placement}', lambda {recipe.lambda_dispersive_stage1} / "
                 f"{recipe.lambda_dispersive_stage2}; photometric perturbation {perturbation}"]
        if self.stage1_epochs >= self.num_epochs:
            lines.append("WARNING: no Stage II epochs: the decoder of the final network stays untrained")
        return lines

    def on_train_epoch_start(self) -> None:
        name = self.stage_for_epoch(self.current_epoch)
        if name != self.training_stage:
            self._enter_stage(name)
            self.print_to_log_file(f"Stage {self.stage.numeral} from epoch {self.current_epoch}: "
                                   f"{self.stage.describe()}")
            empty_cache(self.device)
        self.stage.set_training(True)
        super().on_train_epoch_start()
        lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(self.optimizer.param_groups)}
        for key, value in {**lrs, "stage": self.stage.number}.items():
            self.logger.log(key, value, self.current_epoch)
        self.print_to_log_file(f"Stage {self.stage.numeral}; learning rates: "
                               + ", ".join(f"{k[3:]} {v:.3g}" for k, v in lrs.items()))

    def train_step(self, batch: dict) -> dict:
        """nnU-Net's ``train_step`` (copied, ``nnunet_copies.PINNED``) on the stage's loss; returns the ``step_report``
        (unweighted terms, group gradient norms before clipping, diagnostics). Repeated eagerly on a compile error."""
        data, target, check = self._batch_to_device(batch)
        graph, compilation = self.stage.graph, self.compilation
        timed, start = compilation.compiled and graph not in compilation.first_call_s, time()
        try:
            self.optimizer.zero_grad(set_to_none=True)
            with self.autocast:
                total, terms, features = self.stage.loss(self.network, data, target)
            if self.grad_scaler is not None:
                self.grad_scaler.scale(total).backward()
                self.grad_scaler.unscale_(self.optimizer)
                norms = group_gradient_norms(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self._clipped, 12)
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()
            else:
                total.backward()
                norms = group_gradient_norms(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self._clipped, 12)
                self.optimizer.step()
            report = step_report(total, {**{f"loss_{k}": v for k, v in terms.items()}, **norms}, check)
            report.update(self._diagnostics(features))
        except Exception as error:
            compilation.fall_back(error)  # re-raises unless torch.compile raised it
            return self.train_step(batch)
        if timed:
            compilation.first_call_done(graph, time() - start)
        return report

    # ------------------------------------------------------------------ validation
    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self.stage.set_training(False)
        self._recalibrate_batchnorm()

    def validation_step(self, batch: dict) -> dict:
        """NaN / inf check, then nnU-Net's ``validation_step`` on the stage's logits (B, K, H, W; fp32 under bf16)."""
        self._check_validation_batch(batch)
        return self.compilation.eager(self._validation_step, batch)

    def _validation_step(self, batch: dict) -> dict:
        data = batch["data"].to(self.device, non_blocking=True)
        target = batch["target"].to(self.device, non_blocking=True)
        with self.autocast:
            logits = self.stage.validation_logits(self.network, data)
            if self.bf16:
                logits = logits.float()
            del data
            loss = self.loss(logits, target)
        return validation_counts(self.label_manager, logits, target, loss)

    def _draw_batchnorm_calibration_batches(self) -> List[Tensor]:
        """Training batches (B, C, H, W) on the CPU, seeded by the run seed alone: the same at every call, on every
        rank and after ``--c``, leaving the training stream's random numbers untouched."""
        loader = training_dataloader(self, augmentation=self.recipe.batchnorm_calibration_augmentation)
        count = math.ceil(self.recipe.batchnorm_calibration_samples / self.batch_size)
        with preserved_random_state():
            seed_generators([self.run_seed, 2])
            return [loader.generate_train_batch()["data"] for _ in range(count)]

    def _recalibrate_batchnorm(self) -> None:
        """Re-estimate the BatchNorm statistics of the stage's model for its current weights, eagerly on the plain
        modules (no DDP broadcast): each rank computes the same statistics from the same batches and weights."""
        if self.recipe.batchnorm_calibration_samples <= 0:
            return
        start = time()
        if self._calibration_batches is None:
            self._calibration_batches = self._draw_batchnorm_calibration_batches()
        network, stage = self._plain_network(), self.stage

        def forward(data: Tensor) -> None:
            with self.autocast:
                stage.validation_logits(network, data.to(self.device, non_blocking=True), plain=True)

        layers = self.compilation.eager(recalibrate_batchnorm, stage.batchnorm_modules(), self._calibration_batches,
                                        forward)
        augmentation = "with" if self.recipe.batchnorm_calibration_augmentation else "without"
        self.print_to_log_file(f"BatchNorm statistics of {layers} layers re-estimated over "
                               f"{len(self._calibration_batches) * self.batch_size} training samples "
                               f"({augmentation} augmentation) in {time() - start:.1f} s")

    def _run_final_validation(self, validate: Callable[[bool], None], save_probabilities: bool) -> None:
        """nnU-Net's final validation of the whole network, eagerly (behind the compile fallback)."""
        if self.stage is not None and not self.stage.trains_whole_network:
            self.print_to_log_file("WARNING: validating a network that never reached Stage II (untrained decoder)")
        self.compilation.eager(validate, save_probabilities)

    # ------------------------------------------------------------------ end of epoch, checkpoints
    def _stage_boundaries(self) -> Sequence[int]:
        return (self.stage1_epochs,)

    def _epoch_end_checkpoints(self, epoch: int) -> List[str]:
        """At a stage's end: ``checkpoint_latest.pth`` (unless it is the run's last epoch) and the stage's copy."""
        if epoch != self.stage.last_epoch:
            return []
        end = self.stage.end_checkpoint()
        return (["checkpoint_latest.pth"] if epoch != self.num_epochs - 1 else []) + ([end] if end else [])

    def _checkpoint_extras(self) -> Dict[str, object]:
        return self.stage.checkpoint_extras() if self.stage is not None else {}

    def _before_restoring_checkpoint(self, checkpoint: Mapping[str, object]) -> None:
        """Enter the checkpoint's stage (and its optimizer groups) before nnU-Net restores the state."""
        try:
            name = checkpoint_stage(checkpoint)
        except ValueError as error:
            raise TrainingInputRuntimeError(f"{error}: not a checkpoint of this trainer") from None
        if name != self.training_stage:
            self._enter_stage(name)

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        self.stage.restore(checkpoint)
