"""nnUNetTrainerMedDisSeg: Med-DisSeg's two training stages in one ``nnUNetv2_train`` run."""
import math
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.utilities.helpers import empty_cache
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager

from nnunetv2_meddisseg.blocks.stage1_head import Stage1Head
from nnunetv2_meddisseg.losses import DispersiveLoss
from nnunetv2_meddisseg.training.batchnorm_statistics import BatchNormRecalibration
from nnunetv2_meddisseg.training.compilation import compile_trainer_network, compiled_step
from nnunetv2_meddisseg.training.extended_trainer import ExtendedTrainerBase, unwrap_module
from nnunetv2_meddisseg.training.input_errors import TrainingInputError
from nnunetv2_meddisseg.training.lr_schedule import PerGroupPolyLRScheduler
from nnunetv2_meddisseg.training.meddisseg_plans import (PlansEncoderWeights, build_meddisseg_network,
                                                         network_class_is_meddisseg, plans_recording_the_network,
                                                         require_2d_configuration)
from nnunetv2_meddisseg.training.photometric import photometric_perturbation
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe
from nnunetv2_meddisseg.training.recipes import RECIPES
from nnunetv2_meddisseg.training.stage2_loss import dispersive_from_recipe
from nnunetv2_meddisseg.training.stage_checkpoints import StageCheckpoints
from nnunetv2_meddisseg.training.stage_losses import STAGE_1, STAGE_2, dispersion, stage1_losses, stage2_losses
from nnunetv2_meddisseg.training.stage_validation import StageValidation

__all__ = ["nnUNetTrainerMedDisSeg", "STAGE_1", "STAGE_2", "STAGE1_CHECKPOINT", "RGB_CHANNEL_NAMES",
           "network_class_is_meddisseg", "plans_recording_the_network"]

#: the model at the end of Stage I, kept where the recipe sets ``stage1_checkpoint``
STAGE1_CHECKPOINT = "checkpoint_stage1.pth"
#: dataset.json channel names (lower case) that mark a 3-channel input as RGB (colour perturbations)
RGB_CHANNEL_NAMES = frozenset({"r", "g", "b", "red", "green", "blue", "rgb", "rgb_to_0_1"})
#: the name the trainer's 2D check has had
_require_2d_configuration = require_2d_configuration


class nnUNetTrainerMedDisSeg(StageValidation, StageCheckpoints, PlansEncoderWeights, BatchNormRecalibration,
                             ExtendedTrainerBase):
    """Med-DisSeg (ResNet-50 + ELAT encoder, CDFA, three CBAT decoders) trained in two stages.

    Stage I, epochs ``[0, stage1_epochs)`` (default ``floor(stage1_fraction * num_epochs)``: 250 of
    1000): the network runs with ``encoder_only = True``; a light head (``Stage1Head``) turns the four
    ELAT-refined features into logits. Every batch is also seen under a strong photometric
    perturbation drawn per sample (colour operations for RGB inputs, channel-wise intensity operations
    otherwise); clean and perturbed views go through the network as one batch of 2B; the loss
    (``stage_losses.stage1_losses``) sums segmentation of both views, their consistency and the dispersive
    terms. Adam, both groups (head, encoder+ELAT) at ``stage1_lr`` = 1e-4.

    Stage II, epochs ``[stage1_epochs, num_epochs)``: the full network, encoder and ELAT carried over
    from Stage I; a new Adam with two groups, ``encoder`` (encoder + ELAT, ``stage2_encoder_lr`` =
    1e-5) and ``decoder`` (everything else, ``stage2_lr`` = 1e-4). Deep supervision is on in training,
    so the network returns a ``MedDisSegOutput``; the loss (``stage_losses.stage2_losses``,
    ``stage2_loss.stage2_loss``) adds path supervision, the fg/bg and complementarity terms and the
    dispersive term to the segmentation of the final logits; every output is at full resolution, so
    ``_get_deep_supervision_scales`` returns None and each decoder path is supervised at full resolution.

    Optimizer: ``optimizer`` "adam" (the paper's) or "sgd" (nnU-Net's Nesterov SGD). The values
    above are the paper's, which assume an ImageNet encoder; where the plans name no
    ``encoder_weights`` the settings listed in the recipe's ``from_scratch`` replace them (none by default:
    higher learning rates for a randomly initialised encoder let the early features collapse under
    the uncentred dispersive loss, see docs/method.md).

    Dispersive loss: ``dispersive_variant`` (infonce_l2), ``dispersive_tau`` (0.8), ``dispersive_eps``
    (1e-8, InfoNCE variants), ``dispersive_margin`` (1.0, hinge) at
    ``dispersive_placement`` ("early" = ELAT-refined layer1 output x2; "middle" = x4; "late" = the last
    feature before the logits: the output of D_s in Stage II, the head's fused feature in Stage I;
    "all" = mean of the three). Its diagnostics (mean pairwise d_ij, effective rank) of the first
    regularised layer are computed on each epoch's first training batch.

    Learning rates decay ``(1 - t) ** 0.9`` within each stage from each group's own base rate
    (``PerGroupPolyLRScheduler``); both rates, the stage, every (unweighted) loss term and the
    diagnostics are logged per epoch to the log file and ``progress_terms.png``.

    BatchNorm statistics (off by default: ``batchnorm_calibration_samples = 0``): before every validation,
    so before every checkpoint, the running statistics of the current stage's model are re-estimated
    with its current weights (``batchnorm_statistics.BatchNormRecalibration``).

    Checkpoints record their stage; Stage I checkpoints also hold the head. ``--c`` resumes in the
    recorded stage with that stage's optimizer groups. A ``checkpoint_latest.pth`` is also written at
    the end of Stage I. ``checkpoint_best.pth`` is only written in Stage II (``_may_write_best_checkpoint``),
    and nnU-Net's EMA pseudo Dice restarts at the first Stage II epoch, so the best checkpoint is the
    Stage II network whose own EMA (never the Stage I head's) is the highest.

    Every setting named here is a field of the trainer's recipe (``recipe.MedDisSegRecipe``, the class
    attribute ``recipe``; the paper's values by default); variants are named recipes (``recipes``,
    ``variants``: one line each).

    Kept from nnU-Net: network building from the plans (nnU-Net's default ``nnUNetPlans`` are recorded with
    ``MedDisSegNet``: ``plans_recording_the_network``), data loading and augmentation, autocast + GradScaler on
    CUDA only, gradient clipping at 12, torch.compile (``training.compilation``), validation, export, DDP.
    Under DDP (``-num_gpus N``) the dispersive terms of both stages disperse the batch of every process
    (``dispersive_gather``; in Stage I each view over all processes); in Stage I the head is wrapped in its
    own DDP and the idle decoder parameters enter the loss with weight 0 so that DDP's reducer completes;
    the loss-term curves are averaged over ranks.

    Not supported: 3D configurations (a ``TrainingInputError``, a ``ValueError``, at construction) and region-based
    labels.
    """

    recipe: MedDisSegRecipe = RECIPES["MedDisSeg"]
    #: the torch.compile backend (a name or a callable) where nnU-Net compiles (``training.compilation``)
    compile_backend: Union[str, Callable] = "inductor"
    #: "whole": the network as one graph per stage and mode (nnU-Net's compile, static shapes); "regional": each
    #: block on its own (``training.compilation.compile_regions``), which took longer on an H200
    compile_scope: str = "whole"

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        require_2d_configuration(plans, configuration, self.__class__.__name__)
        plans = plans_recording_the_network(plans, configuration)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.initial_lr = self.recipe.stage2_lr
        self.training_stage: Optional[str] = None
        self.stage1_head: Optional[nn.Module] = None
        self.dispersive: Optional[DispersiveLoss] = None
        self._calibration_batches: Optional[List[Tensor]] = None
        #: the network (and the Stage I head) are compiled (``_compile_network``)
        self.compiled = False
        self._timed_steps: set = set()

    # ------------------------------------------------------------------ settings
    def _class_recipe(self) -> MedDisSegRecipe:
        """The class's recipe, with its ``from_scratch`` settings where the encoder starts from random
        initialisation (the plans name no ``encoder_weights``)."""
        self.encoder_pretrained = self._plans_name_encoder_weights()
        recipe = super()._class_recipe()
        return recipe if self.encoder_pretrained else recipe.for_random_encoder()

    def _make_optimizer(self, groups: Sequence[dict]) -> torch.optim.Optimizer:
        recipe = self.recipe
        if recipe.optimizer == "adam":
            # one fused kernel per step for all parameters on CUDA (same update as the for-each form)
            return torch.optim.Adam(groups, weight_decay=recipe.adam_weight_decay, fused=self.device.type == "cuda")
        return torch.optim.SGD(groups, momentum=recipe.sgd_momentum, nesterov=True, weight_decay=recipe.sgd_weight_decay)

    # ------------------------------------------------------------------ stages
    @property
    def stage1_epochs(self) -> int:
        """Epochs of Stage I: the recipe's ``stage1_epochs``, else ``floor(stage1_fraction * num_epochs)``."""
        if self.recipe.stage1_epochs is not None:
            return self.recipe.stage1_epochs
        return int(math.floor(self.recipe.stage1_fraction * self.num_epochs))

    @stage1_epochs.setter
    def stage1_epochs(self, value: int) -> None:
        self.recipe = replace(self.recipe, stage1_epochs=int(value))

    def stage_for_epoch(self, epoch: int) -> str:
        return STAGE_1 if epoch < self.stage1_epochs else STAGE_2

    def _stage_boundaries(self) -> Sequence[int]:
        return (self.stage1_epochs,)

    def _plain_head(self) -> Optional[nn.Module]:
        return unwrap_module(self.stage1_head)

    def _build_stage1_head(self) -> nn.Module:
        norm_op, norm_op_kwargs = self._plain_network().added_norm
        head = Stage1Head(self.label_manager.num_segmentation_heads, width=self.recipe.stage1_head_width, norm_op=norm_op,
                          norm_op_kwargs=norm_op_kwargs).to(self.device)
        if self.is_ddp:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            head = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(head), device_ids=device_ids)
        if self.compiled:
            unwrap_module(head).compile(backend=self.compile_backend, dynamic=False)
        return head

    def configure_optimizers(self, stage: Optional[str] = None):
        """Optimizer and per-group schedule of ``stage`` (default: the stage of the current epoch).

        Also puts the network into that stage (``encoder_only``), builds the Stage I head when
        needed and drops it in Stage II.
        """
        stage = stage or self.stage_for_epoch(self.current_epoch)
        network, recipe = self._plain_network(), self.recipe
        if stage == STAGE_1:
            if self.stage1_head is None:
                self.stage1_head = self._build_stage1_head()
            groups = [
                {"name": "decoder", "params": list(self._plain_head().parameters()), "lr": recipe.stage1_lr},
                {"name": "encoder", "params": list(network.encoder_parameters()), "lr": recipe.stage1_lr},
            ]
            start, length = 0, self.stage1_epochs
        elif stage == STAGE_2:
            self.stage1_head = None
            groups = [
                {"name": "decoder", "params": list(network.non_encoder_parameters()), "lr": recipe.stage2_lr},
                {"name": "encoder", "params": list(network.encoder_parameters()), "lr": recipe.stage2_encoder_lr},
            ]
            start, length = self.stage1_epochs, self.num_epochs - self.stage1_epochs
        else:
            raise ValueError(f"unknown training stage {stage!r}, expected {STAGE_1!r} or {STAGE_2!r}")
        network.encoder_only = stage == STAGE_1
        optimizer = self._make_optimizer(groups)
        scheduler = PerGroupPolyLRScheduler(optimizer, [g["lr"] for g in groups], start, max(length, 1),
                                            recipe.lr_exponent)
        self.training_stage = stage
        return optimizer, scheduler

    def _enter_stage(self, stage: str) -> None:
        previous = self.training_stage
        self.optimizer, self.lr_scheduler = self.configure_optimizers(stage)
        if previous == STAGE_1 and stage == STAGE_2:
            self._best_ema = None
            self.print_to_log_file(f"Stage II from epoch {self.current_epoch}: full network, {self.recipe.optimizer} lr "
                                   f"{self.recipe.stage2_encoder_lr} (encoder + ELAT) / {self.recipe.stage2_lr} (rest)")
        empty_cache(self.device)

    # ------------------------------------------------------------------ nnU-Net hooks
    @staticmethod
    def build_network_architecture(plans_manager: PlansManager,
                                   configuration_manager: ConfigurationManager,
                                   num_input_channels: int,
                                   num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> nn.Module:
        """MedDisSegNet from the plans' ``arch_kwargs`` when the plans name it (``nnUNetMedDisSegPlans``, and the
        plans this trainer records with a model), else (a ``plans.json`` that names nnU-Net's network)
        MedDisSegNet as ``nnUNetv2_meddisseg_plan`` writes it by default (``meddisseg_plans.build_meddisseg_network``).

        The plans' ``encoder_weights`` are never read here: nnU-Net's predictor builds the network through
        this method and then loads the checkpoint's weights (a trained model predicts where that file does
        not exist); training loads them in ``initialize`` (``_load_encoder_weights``).
        """
        return build_meddisseg_network(configuration_manager, num_input_channels, num_output_channels,
                                       enable_deep_supervision)

    def _get_deep_supervision_scales(self):
        # every output of MedDisSegNet is at full resolution: no down-sampled targets
        return None

    @contextmanager
    def _single_output(self):
        """Within the block, nnU-Net's methods see ``enable_deep_supervision`` False: one output and one target
        at full resolution (every output of MedDisSegNet is at full resolution; ``_get_deep_supervision_scales``)."""
        deep_supervision, self.enable_deep_supervision = self.enable_deep_supervision, False
        try:
            yield
        finally:
            self.enable_deep_supervision = deep_supervision

    def _build_loss(self) -> nn.Module:
        """nnU-Net's loss (Dice + CE; the Dice compiled where nnU-Net compiles it) without its deep-supervision
        wrapper: ``seg`` of both stages (``stage2_loss`` applies it to every full-resolution output)."""
        if self.label_manager.has_regions:
            raise TrainingInputError(f"{self.__class__.__name__} does not support region-based labels "
                                     f"(dataset.json 'regions_class_order')")
        with self._single_output():
            return super()._build_loss()

    def initialize(self) -> None:
        if self.label_manager.has_regions:
            raise TrainingInputError(f"{self.__class__.__name__} does not support region-based labels "
                                     f"(dataset.json 'regions_class_order')")
        if not self.enable_deep_supervision:
            raise ValueError(f"{self.__class__.__name__} needs enable_deep_supervision = True: Stage II trains on "
                             f"the network's auxiliary outputs")
        if not 0 <= self.stage1_epochs <= self.num_epochs:
            raise TrainingInputError(f"{self.__class__.__name__}: the recipe's stage1_epochs must lie in [0, "
                                     f"num_epochs={self.num_epochs}], got {self.stage1_epochs}")
        self.dispersive = dispersive_from_recipe(self.recipe, self.dispersive_gather)
        was_initialized = self.was_initialized
        super().initialize()
        if not was_initialized:
            self._compile_network()
            self._load_encoder_weights()
            self._initial_stem = next(self._plain_network().parameters()).detach().clone()

    # ------------------------------------------------------------------ compilation
    def _set_network(self, network: nn.Module) -> None:
        """Replace the network inside the DDP wrapper where there is one, else ``self.network``."""
        if isinstance(self.network, DDP):
            self.network.module = network
        else:
            self.network = network

    def _compile_network(self) -> None:
        """Where nnU-Net compiled the network (``_do_i_compile``), compile it again as ``compile_scope`` says,
        with static shapes (``training.compilation.compile_trainer_network``); the Stage I head is compiled when
        it is built."""
        compile_trainer_network(self)

    def on_train_start(self) -> None:
        super().on_train_start()
        origin, recipe = self._encoder_origin(), self.recipe
        self._initial_stem = None
        self.print_to_log_file(f"encoder from {origin}: {recipe.optimizer}, learning rates Stage I {recipe.stage1_lr}, "
                               f"Stage II {recipe.stage2_encoder_lr} (encoder + ELAT) / {recipe.stage2_lr} (rest)")
        self.print_to_log_file(
            f"Med-DisSeg: Stage I epochs 0-{self.stage1_epochs - 1}, Stage II epochs {self.stage1_epochs}-"
            f"{self.num_epochs - 1}; dispersive {recipe.dispersive_variant} tau {recipe.dispersive_tau} at "
            f"'{recipe.dispersive_placement}', lambda {recipe.lambda_dispersive_stage1} / "
            f"{recipe.lambda_dispersive_stage2}; photometric perturbation {'RGB' if self._input_is_rgb() else 'channel-wise'}")
        if self.stage1_epochs >= self.num_epochs:
            self.print_to_log_file("WARNING: no Stage II epochs: the decoder of the final network stays untrained")

    def on_train_epoch_start(self) -> None:
        stage = self.stage_for_epoch(self.current_epoch)
        if stage != self.training_stage:
            self._enter_stage(stage)
        if self.stage1_head is not None:
            self.stage1_head.train()
        super().on_train_epoch_start()
        lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(self.optimizer.param_groups)}
        for key, value in {**lrs, "stage": 1 if stage == STAGE_1 else 2}.items():
            self.logger.log(key, value, self.current_epoch)
        self.print_to_log_file(f"Stage {'I' if stage == STAGE_1 else 'II'}; learning rates: "
                               + ", ".join(f"{k[3:]} {v:.3g}" for k, v in lrs.items()))

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        if self.stage1_head is not None:
            self.stage1_head.eval()
        self._recalibrate_batchnorm()

    def on_validation_epoch_end(self, val_outputs) -> None:
        super().on_validation_epoch_end(val_outputs)
        if self.current_epoch == self.stage1_epochs:
            # the first Stage II network: its EMA pseudo Dice starts afresh, not from the Stage I head's
            self._restart_ema_fg_dice()

    def _may_write_best_checkpoint(self) -> bool:
        return self.training_stage == STAGE_2  # a Stage I network has an untrained decoder

    def on_epoch_end(self) -> None:
        end_of_stage1 = self.training_stage == STAGE_1 and self.current_epoch == self.stage1_epochs - 1
        saved_periodically = (self.current_epoch + 1) % self.save_every == 0
        last_epoch = self.current_epoch == self.num_epochs - 1
        super().on_epoch_end()  # increments current_epoch
        if not end_of_stage1:
            return
        self.current_epoch -= 1  # the checkpoints must record the finished epoch, as nnU-Net's on_train_end does
        if not saved_periodically and not last_epoch:
            self.save_checkpoint(join(self.output_folder, "checkpoint_latest.pth"))
        if self.recipe.stage1_checkpoint:
            self.save_checkpoint(join(self.output_folder, STAGE1_CHECKPOINT))
        self.current_epoch += 1

    # ------------------------------------------------------------------ steps
    def _input_is_rgb(self) -> bool:
        if self.recipe.photometric_rgb is not None:
            return bool(self.recipe.photometric_rgb)
        if self.num_input_channels != 3:
            return False
        names = self.dataset_json.get("channel_names", self.dataset_json.get("modality", {}))
        lowered = [str(v).lower() for v in names.values()]
        return len(lowered) == 3 and all(n in RGB_CHANNEL_NAMES for n in lowered)

    def _dispersion(self, features: Mapping[str, Tensor]) -> Tuple[Tensor, Tensor]:
        """(loss, features of the first regularised layer for the diagnostics)."""
        return dispersion(self.dispersive, features)

    def _stage1_losses(self, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        perturbed = photometric_perturbation(data, rgb=self._input_is_rgb())
        idle = None
        if isinstance(self.network, DDP):  # DDP's reducer expects a gradient for every parameter
            idle = [p for p in self._plain_network().non_encoder_parameters() if p.requires_grad]
        return stage1_losses(self.network, self.stage1_head, self.loss, self.dispersive, self.recipe, data, perturbed,
                             target, idle)

    def _stage2_losses(self, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        return stage2_losses(self.network, self.loss, self.dispersive, self.recipe, data, target,
                             self.label_manager.ignore_label)

    def train_step(self, batch: dict) -> dict:
        return compiled_step(self, "training", self._train_step, batch)

    def _train_step(self, batch: dict) -> dict:
        data, target = self._batch_to_device(batch, training=True)
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            if self.training_stage == STAGE_1:
                total, terms, diagnosed = self._stage1_losses(data, target)
            else:
                total, terms, diagnosed = self._stage2_losses(data, target)
        gradient_norms = self._optimizer_step(total)
        # one transfer to the host for the loss, every logged term and norm, and the batch's input check
        result = self._step_result(total, {**{f"loss_{k}": v for k, v in terms.items()}, **gradient_norms})
        result.update(self._dispersion_diagnostics(diagnosed))
        return result
