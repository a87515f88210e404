"""nnUNetTrainerMedDisSeg: Med-DisSeg's two training stages in one ``nnUNetv2_train`` run."""
import math
import os
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import replace
from time import time
from pydoc import locate
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch._dynamo import OptimizedModule
from torch.nn.parallel import DistributedDataParallel as DDP
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
from nnunetv2.utilities.helpers import empty_cache
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager

from nnunetv2_meddisseg.architectures import MedDisSegNet, MedDisSegOutput
from nnunetv2_meddisseg.blocks.encoder import load_resnet50_weights, resolve_encoder_weights
from nnunetv2_meddisseg.blocks.stage1_head import Stage1Head
from nnunetv2_meddisseg.losses import DispersiveLoss, consistency_loss
from nnunetv2_meddisseg.plans_entry import architecture_entry
from nnunetv2_meddisseg.training.extended_trainer import ExtendedTrainerBase, unwrap_module
from nnunetv2_meddisseg.training.batchnorm_statistics import recalibrate_batchnorm
from nnunetv2_meddisseg.training.compilation import (COMPILE_SCOPES, compile_error_summary, compile_network,
                                                     eager_stance, is_compile_error, uncompile_regions)
from nnunetv2_meddisseg.training.lr_schedule import PerGroupPolyLRScheduler
from nnunetv2_meddisseg.training.nnunet_copies import training_dataloader
from nnunetv2_meddisseg.training.photometric import photometric_perturbation
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe
from nnunetv2_meddisseg.training.recipes import RECIPES
from nnunetv2_meddisseg.training.stage2_loss import Stage2Weights, dispersive_from_recipe, stage2_loss
from nnunetv2_meddisseg.training.seeding import preserved_random_state, seed_generators

__all__ = ["nnUNetTrainerMedDisSeg", "STAGE_1", "STAGE_2", "STAGE1_CHECKPOINT", "RGB_CHANNEL_NAMES"]

STAGE_1 = "stage1"
STAGE_2 = "stage2"
#: the model at the end of Stage I, kept where the recipe sets ``stage1_checkpoint``
STAGE1_CHECKPOINT = "checkpoint_stage1.pth"
#: dataset.json channel names (lower case) that mark a 3-channel input as RGB (colour perturbations)
RGB_CHANNEL_NAMES = frozenset({"r", "g", "b", "red", "green", "blue", "rgb", "rgb_to_0_1"})


def network_class_is_meddisseg(configuration_manager: ConfigurationManager) -> bool:
    """True when the configuration's network class is MedDisSegNet or a subclass of it (as in
    ``nnUNetMedDisSegPlans``; False for nnU-Net's default plans, whatever their name)."""
    class_name = configuration_manager.network_arch_class_name
    located = locate(class_name) if isinstance(class_name, str) else None
    return isinstance(located, type) and issubclass(located, MedDisSegNet)


def plans_recording_the_network(plans: dict, configuration: str) -> dict:
    """``plans`` where ``configuration`` builds MedDisSegNet; else (e.g. nnU-Net's default ``nnUNetPlans``) a
    copy whose configuration names MedDisSegNet as ``nnUNetv2_meddisseg_plan`` writes it by default
    (:func:`~nnunetv2_meddisseg.plans_entry.architecture_entry`), so that the plans nnU-Net saves with the
    model (``plans.json``, the checkpoints' ``init_args``) rebuild the network the trainer trained."""
    if network_class_is_meddisseg(PlansManager(deepcopy(plans)).get_configuration(configuration)):
        return plans
    recorded = deepcopy(plans)
    recorded["configurations"][configuration]["architecture"] = architecture_entry()
    return recorded


def _require_2d_configuration(plans: dict, configuration: str, trainer_name: str) -> None:
    manager = PlansManager(deepcopy(plans)).get_configuration(configuration)
    patch_size = list(manager.patch_size)
    if len(patch_size) != 2:
        raise ValueError(f"{trainer_name} trains 2D networks only, but configuration '{configuration}' has a "
                         f"{len(patch_size)}D patch size {patch_size}: use the 2d configuration (-c 2d), or "
                         f"nnUNetTrainerDispersive for 3D.")


class nnUNetTrainerMedDisSeg(ExtendedTrainerBase):
    """Med-DisSeg (ResNet-50 + ELAT encoder, CDFA, three CBAT decoders) trained in two stages.

    Stage I, epochs ``[0, stage1_epochs)`` (default ``floor(stage1_fraction * num_epochs)``: 250 of
    1000): the network runs with ``encoder_only = True``; a light head (``Stage1Head``) turns the four
    ELAT-refined features into logits. Every batch is also seen under a strong photometric
    perturbation drawn per sample (colour operations for RGB inputs, channel-wise intensity operations
    otherwise); clean and perturbed views go through the network as one batch of 2B (one forward, so
    BatchNorm statistics are shared by both views and DDP sees a single forward). Loss::

        seg(clean) + seg(perturbed) + consistency_weight * consistency(clean, perturbed)
        + lambda_dispersive_stage1 * (dispersive(clean) + dispersive(perturbed))

    with ``seg`` nnU-Net's Dice+CE. Adam, both groups (head, encoder+ELAT) at ``stage1_lr`` = 1e-4.

    Stage II, epochs ``[stage1_epochs, num_epochs)``: the full network, encoder and ELAT carried over
    from Stage I; a new Adam with two groups, ``encoder`` (encoder + ELAT, ``stage2_encoder_lr`` =
    1e-5) and ``decoder`` (everything else, ``stage2_lr`` = 1e-4). Deep supervision is on in training,
    so the network returns a ``MedDisSegOutput``. Loss::

        seg(logits) + path_supervision_weight * mean(seg(O_S), seg(O_M), seg(O_L))
        + fg_bg_weight * foreground_background_loss(fg, bg, any foreground class)
        + complementarity_weight * complementarity_loss(fg, bg, uc)
        + lambda_dispersive_stage2 * dispersive

    (``stage2_loss.stage2_loss``; pixels with nnU-Net's ignore label count in no term of the fg/bg
    maps). Deep supervision choice: nnU-Net's multi-resolution deep supervision does not apply (all
    outputs are at full resolution), so ``_get_deep_supervision_scales`` returns None and the dataloader
    yields full-resolution targets. Instead, each of the three decoder paths (whose sum forms the
    final logits) is supervised with the same Dice+CE, averaged and weighted 0.5, so that every path
    is a usable predictor on its own (set ``path_supervision_weight = 0`` to train the final logits
    only, as the released code does). ``seg`` is ``DC_and_CE_loss`` built as nnU-Net's
    ``_build_loss`` builds it, without the deep-supervision wrapper.

    Optimizer: ``optimizer`` "adam" (the paper's) or "sgd" (nnU-Net's Nesterov SGD). The values
    above are the paper's, which assume an ImageNet encoder; where the plans name no
    ``encoder_weights`` the settings listed in the recipe's ``from_scratch`` replace them (none by default:
    higher learning rates for a randomly initialised encoder let the early features collapse under
    the uncentred dispersive loss, see the README).

    Dispersive loss: ``dispersive_variant`` (infonce_l2), ``dispersive_tau`` (0.8), ``dispersive_eps``
    (1e-8, InfoNCE variants), ``dispersive_margin`` (1.0, hinge) at
    ``dispersive_placement`` ("early" = ELAT-refined layer1 output x2; "middle" = x4; "late" = the last
    feature before the logits: the output of D_s in Stage II, the head's fused feature in Stage I;
    "all" = mean of the three). Its diagnostics (mean pairwise d_ij, effective rank) of the first
    regularised layer are computed on each epoch's first training batch.

    Learning rates decay ``(1 - t) ** 0.9`` within each stage from each group's own base rate
    (``PerGroupPolyLRScheduler``); both rates, the stage, every (unweighted) loss term and the
    diagnostics are logged per epoch to the log file and ``progress_terms.png``.

    BatchNorm statistics (off by default: ``batchnorm_calibration_samples = 0``): before every validation
    (nnU-Net's online validation at each epoch's end, so
    before every ``checkpoint_best.pth``, ``checkpoint_latest.pth`` and ``checkpoint_final.pth``) the
    running statistics of the current stage's model are re-estimated with its current weights over
    ``batchnorm_calibration_samples`` training samples (``batchnorm_statistics``): the same batches
    every time, drawn as nnU-Net's dataloader draws them (``batchnorm_calibration_augmentation``: through
    its training augmentation or not) from a generator of their own, so that no weight and no random
    number of training changes and ``--c`` re-estimates the same statistics. At the small batches of 2D
    plans the running averages of training trail the weights; nnU-Net validates and predicts with them.

    Checkpoints record their stage; Stage I checkpoints also hold the head. ``--c`` resumes in the
    recorded stage with that stage's optimizer groups. A ``checkpoint_latest.pth`` is also written at
    the end of Stage I. ``checkpoint_best.pth`` is only written in Stage II (``_may_write_best_checkpoint``),
    and nnU-Net's EMA pseudo Dice restarts at the first Stage II epoch, so the best checkpoint is the
    Stage II network whose own EMA (never the Stage I head's) is the highest.

    Every setting named here is a field of the trainer's recipe (``recipe.MedDisSegRecipe``, the class
    attribute ``recipe``; the paper's values by default); variants are named recipes (``recipes``,
    ``variants``: one line each).

    Kept from nnU-Net: network building from the plans (with nnU-Net's default ``nnUNetPlans``, whose
    architecture is not Med-DisSeg, the trainer's plans name ``MedDisSegNet`` as ``nnUNetv2_meddisseg_plan``
    plans it by default, and the model's ``plans.json`` records it: ``plans_recording_the_network``), data
    loading and augmentation, autocast + GradScaler on CUDA only, gradient clipping at 12,
    torch.compile (unwrapped via ``_orig_mod``), validation, export, DDP. Under DDP (``-num_gpus N``)
    the dispersive terms of both stages disperse the batch of every process (``dispersive_gather``;
    in Stage I the clean and the perturbed views each over all processes); in Stage I the head is
    wrapped in its own DDP and the unused decoder parameters receive zero gradients (added to the loss
    with weight 0) so that DDP's reducer completes; the loss-term curves are averaged over ranks. Run
    on CPU processes (gloo) in the tests; on several GPUs, see the README.

    Not supported: 3D configurations (a ``ValueError`` at construction) and region-based labels.
    """

    recipe: MedDisSegRecipe = RECIPES["MedDisSeg"]
    #: the torch.compile backend (a name or a callable) where nnU-Net compiles (``training.compilation``)
    compile_backend: Union[str, Callable] = "inductor"
    #: "whole": the network as one graph per stage and mode (nnU-Net's compile, static shapes); "regional": each
    #: block on its own (``training.compilation.compile_regions``), which took longer on an H200
    compile_scope: str = "whole"

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        _require_2d_configuration(plans, configuration, self.__class__.__name__)
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
    def _plans_name_encoder_weights(self) -> bool:
        """True when the plans build MedDisSegNet with ``encoder_weights`` (a file or ``imagenet``)."""
        return self._plans_encoder_weights() is not None

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
        MedDisSegNet as ``nnUNetv2_meddisseg_plan`` writes it by default
        (:func:`~nnunetv2_meddisseg.plans_entry.architecture_entry`).

        The plans' ``encoder_weights`` are never read here: nnU-Net's predictor builds the network through
        this method and then loads the checkpoint's weights (a trained model predicts where that file does
        not exist); training loads them in ``initialize`` (``_load_encoder_weights``).
        """
        if network_class_is_meddisseg(configuration_manager):
            class_name = configuration_manager.network_arch_class_name
            arch_kwargs = dict(configuration_manager.network_arch_init_kwargs)
            requires_import = configuration_manager.network_arch_init_kwargs_req_import
        else:
            entry = architecture_entry()
            class_name, arch_kwargs, requires_import = (entry["network_class_name"], entry["arch_kwargs"],
                                                        entry["_kw_requires_import"])
        arch_kwargs["encoder_weights"] = None
        return get_network_from_plans(class_name, arch_kwargs, requires_import, num_input_channels,
                                      num_output_channels, allow_init=True, deep_supervision=enable_deep_supervision)

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
            raise ValueError(f"{self.__class__.__name__} does not support region-based labels "
                             f"(dataset.json 'regions_class_order')")
        with self._single_output():
            return super()._build_loss()

    def initialize(self) -> None:
        if self.label_manager.has_regions:
            raise ValueError(f"{self.__class__.__name__} does not support region-based labels "
                             f"(dataset.json 'regions_class_order')")
        if not self.enable_deep_supervision:
            raise ValueError(f"{self.__class__.__name__} needs enable_deep_supervision = True: Stage II trains on "
                             f"the network's auxiliary outputs")
        if not 0 <= self.stage1_epochs <= self.num_epochs:
            raise ValueError(f"{self.__class__.__name__}: stage1_epochs must lie in [0, num_epochs={self.num_epochs}], "
                             f"got {self.stage1_epochs}")
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
        with static shapes (``training.compilation.compile_network``: one graph per stage and mode, no
        recompilation within a stage); the Stage I head is compiled when it is built."""
        holder = self.network.module if isinstance(self.network, DDP) else self.network
        if not isinstance(holder, OptimizedModule):
            return
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"{type(self).__name__}.compile_scope must be one of {', '.join(COMPILE_SCOPES)}, got "
                             f"{self.compile_scope!r}")
        plain = holder._orig_mod
        if self.device.type == "cuda" and hasattr(plain, "_use_channels_last"):
            plain._use_channels_last()  # the layout the compiled graphs see (an eager forward sets it itself)
        compiled, what = compile_network(plain, self.compile_scope, backend=self.compile_backend)
        self._set_network(compiled)
        self.compiled = True
        if self.stage1_head is not None:
            unwrap_module(self.stage1_head).compile(backend=self.compile_backend, dynamic=False)
        backend = getattr(self.compile_backend, "__name__", self.compile_backend)
        self.print_to_log_file(f"torch.compile ({backend}) of {what}, static shapes (nnUNet_compile=f runs eagerly)")

    def _continue_eagerly(self, error: Exception) -> None:
        """After ``error`` in a compiled step: re-raise it unless torch.compile raised it; else undo the
        compilation, say so in one line of the log, and let the caller repeat the step eagerly."""
        if not self.compiled or not is_compile_error(error):
            raise error
        plain = self._plain_network()
        self._set_network(plain)  # the whole-network wrapper goes
        uncompile_regions(plain)  # and so do compiled blocks, the head's too; dynamo's caches are dropped
        if self._plain_head() is not None:
            uncompile_regions(self._plain_head())
        self.compiled = False
        self.print_to_log_file(f"WARNING: torch.compile failed ({compile_error_summary(error)}); training "
                               f"continues without compilation (set nnUNet_compile=f to skip compiling)")

    def _plans_encoder_weights(self) -> Optional[str]:
        """The plans' ``encoder_weights`` (a file or ``imagenet``), None where they name none."""
        if not network_class_is_meddisseg(self.configuration_manager):
            return None
        return self.configuration_manager.network_arch_init_kwargs.get("encoder_weights") or None

    def _load_encoder_weights(self) -> None:
        """Load the plans' ``encoder_weights`` into the encoder of the network ``initialize`` built: training
        only (prediction loads the checkpoint), before ``--c`` or ``-pretrained_weights`` load theirs over them."""
        weights = self._plans_encoder_weights()
        if weights is None:
            return
        path = resolve_encoder_weights(weights)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"encoder weights file not found: {path} (the plans' encoder_weights)")
        load_resnet50_weights(self._plain_network().encoder, path)

    def _encoder_origin(self) -> str:
        """Where the encoder's weights come from, for the log: the plans' ``encoder_weights``, random
        initialisation, or the file nnU-Net's ``-pretrained_weights`` loaded after ``initialize`` (nnU-Net
        does not tell the trainer; the network's first weight tensor tells: it changed since ``initialize``)."""
        first = next(self._plain_network().parameters()).detach()
        if getattr(self, "_initial_stem", None) is not None and self.current_epoch == 0 and \
                not torch.equal(first.to(self._initial_stem.device), self._initial_stem):
            return "the weights -pretrained_weights loaded (every layer whose name and shape match)"
        weights = self._plans_encoder_weights()
        return f"pretrained weights ({weights})" if weights else "random initialisation"

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

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        network = self._plain_network()
        encoder_only = network.encoder_only
        network.encoder_only = False
        if self.training_stage == STAGE_1:
            self.print_to_log_file("WARNING: validating a network that never reached Stage II (untrained decoder)")
        try:
            super().perform_actual_validation(save_probabilities)
        finally:
            network.encoder_only = encoder_only

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_extras(self) -> Dict[str, object]:
        extras: Dict[str, object] = {"meddisseg_stage": self.training_stage}
        if self.training_stage == STAGE_1 and self.stage1_head is not None:
            extras["stage1_head_weights"] = self._plain_head().state_dict()
        return extras

    def _before_restoring_checkpoint(self, checkpoint: Mapping[str, object]) -> None:
        stage = checkpoint.get("meddisseg_stage")
        if stage is None:  # not written by this trainer: a Stage I checkpoint always holds the head
            stage = STAGE_1 if "stage1_head_weights" in checkpoint else STAGE_2
        if stage not in (STAGE_1, STAGE_2):
            raise RuntimeError(f"checkpoint records an unknown Med-DisSeg stage {stage!r}")
        if stage == STAGE_1 and "stage1_head_weights" not in checkpoint:
            raise RuntimeError("a Stage I checkpoint without 'stage1_head_weights' cannot be resumed")
        if stage != self.training_stage or (stage == STAGE_1 and self.stage1_head is None):
            self.optimizer, self.lr_scheduler = self.configure_optimizers(stage)

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        if self.training_stage == STAGE_1:
            self._plain_head().load_state_dict(checkpoint["stage1_head_weights"])

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
        return self.dispersive(features), features[self.dispersive.placements[0]]

    def _stage1_losses(self, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        b, size = data.shape[0], data.shape[-2:]
        perturbed = photometric_perturbation(data, rgb=self._input_is_rgb())
        features = self.network(torch.cat([data, perturbed], dim=0))
        padded = (2 * features[0].shape[-2], 2 * features[0].shape[-1])
        logits, fused = self.stage1_head(features, padded)
        logits = logits[..., :size[0], :size[1]]
        views = []
        for half in (slice(0, b), slice(b, 2 * b)):
            views.append({"early": features[1][half], "middle": features[3][half], "late": fused[half]})
        seg_clean = self.loss(logits[:b], target)
        seg_perturbed = self.loss(logits[b:], target)
        consistency = consistency_loss(logits[:b], logits[b:])
        dispersive_clean, diagnosed = self._dispersion(views[0])
        dispersive_perturbed, _ = self._dispersion(views[1])
        dispersive = dispersive_clean + dispersive_perturbed
        total = (seg_clean + seg_perturbed + self.recipe.consistency_weight * consistency
                 + self.recipe.lambda_dispersive_stage1 * dispersive)
        if isinstance(self.network, DDP):
            # DDP's reducer expects a gradient for every parameter: the decoder is idle in Stage I
            idle = [p for p in self._plain_network().non_encoder_parameters() if p.requires_grad]
            total = total + 0.0 * sum(p.sum() for p in idle)
        terms = {"seg": seg_clean, "seg_perturbed": seg_perturbed, "consistency": consistency,
                 "dispersive": dispersive}
        return total, terms, diagnosed

    def _stage2_losses(self, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        output = self.network(data)
        total, terms = stage2_loss(output, target, self.loss, self.dispersive, Stage2Weights.from_recipe(self.recipe),
                                   self.label_manager.ignore_label)
        return total, terms, output.features[self.dispersive.placements[0]]

    def train_step(self, batch: dict) -> dict:
        with self._timed_first_step("training"):
            try:
                return self._train_step(batch)
            except Exception as error:  # a compile error: once, then eagerly (``_continue_eagerly``)
                self._continue_eagerly(error)
                return self._train_step(batch)

    @contextmanager
    def _timed_first_step(self, kind: str):
        """Log the seconds of the first ``kind`` step of each stage where the network is compiled (its graphs
        are compiled in that step; the step ends with a transfer to the host, so no extra synchronisation)."""
        key = (kind, self.training_stage)
        if not self.compiled or key in self._timed_steps:
            yield
            return
        self._timed_steps.add(key)
        start = time()
        yield
        stage = "I" if self.training_stage == STAGE_1 else "II"
        self.print_to_log_file(f"first {kind} step of Stage {stage}: {time() - start:.1f} s (compilation included)")

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

    def _validation_logits(self, data: Tensor, network: Optional[nn.Module] = None,
                           head: Optional[nn.Module] = None) -> Tensor:
        """Logits (B, K, H, W) of the current stage's model (Stage I: network + head) for data (B, C, H, W);
        ``network`` / ``head`` default to the trainer's (possibly wrapped) modules."""
        network = self.network if network is None else network
        if self.training_stage == STAGE_1:
            head = self.stage1_head if head is None else head
            features = network(data)
            padded = (2 * features[0].shape[-2], 2 * features[0].shape[-1])
            logits, _ = head(features, padded)
            return logits[..., :data.shape[-2], :data.shape[-1]]
        output = network(data)
        return output.logits if isinstance(output, MedDisSegOutput) else output

    # ------------------------------------------------------------------ BatchNorm statistics
    def _draw_batchnorm_calibration_batches(self) -> List[Tensor]:
        """``ceil(batchnorm_calibration_samples / batch_size)`` training batches (B, C, H, W) on the CPU,
        drawn as nnU-Net's training dataloader draws them (with or without its augmentation) from a
        generator seeded by the run seed alone: the same batches at every call, on every rank and after
        ``--c``, and no random number of the training stream is used."""
        loader = training_dataloader(self, augmentation=self.recipe.batchnorm_calibration_augmentation)
        count = math.ceil(self.recipe.batchnorm_calibration_samples / self.batch_size)
        with preserved_random_state():
            seed_generators([self.run_seed, 2])
            return [loader.generate_train_batch()["data"] for _ in range(count)]

    def _recalibrate_batchnorm(self) -> None:
        """Re-estimate the running statistics of the current stage's model (network, and the head in Stage
        I) on the calibration batches, so that validation, ``checkpoint_best.pth``,
        ``checkpoint_final.pth`` and every prediction from them normalise with statistics of the weights
        they hold (``batchnorm_statistics``). Runs the unwrapped modules (no DDP buffer broadcast, no
        compiled code): each rank computes the same statistics from the same batches and weights."""
        if self.recipe.batchnorm_calibration_samples <= 0 or self.training_stage is None:
            return
        start = time()
        if self._calibration_batches is None:
            self._calibration_batches = self._draw_batchnorm_calibration_batches()
        network, head = self._plain_network(), self._plain_head()
        modules = [network] if head is None or self.training_stage != STAGE_1 else [network, head]

        def forward(data: Tensor) -> None:
            with self._autocast():
                self._validation_logits(data.to(self.device, non_blocking=True), network, head)

        with eager_stance():  # a few forwards: not worth graphs of their own
            layers = recalibrate_batchnorm(modules, self._calibration_batches, forward)
        self.print_to_log_file(f"BatchNorm statistics of {layers} layers re-estimated over "
                               f"{len(self._calibration_batches) * self.batch_size} training samples "
                               f"({'with' if self.recipe.batchnorm_calibration_augmentation else 'without'} augmentation) "
                               f"in {time() - start:.1f} s")

    def validation_step(self, batch: dict) -> dict:
        """nnU-Net's ``validation_step`` on the current stage's model: while it runs, the ``self.network`` it
        calls returns that model's logits (B, K, H, W) (``_validation_logits``: Stage I network + head, Stage II
        the network's final logits), under ``_autocast`` (fp32 under bf16 autocast), and deep supervision
        is off (one full-resolution output, as ``_get_deep_supervision_scales`` gives one target), so
        nnU-Net's loss, pseudo Dice and ignore-label handling apply to them unchanged."""
        with self._timed_first_step("validation"):
            try:
                return self._validation_step(batch)
            except Exception as error:  # a compile error: once, then eagerly (``_continue_eagerly``)
                self._continue_eagerly(error)
                return self._validation_step(batch)

    def _validation_step(self, batch: dict) -> dict:
        network, head = self.network, self.stage1_head

        def stage_logits(data: Tensor) -> Tensor:
            with self._autocast():
                logits = self._validation_logits(data, network, head)
            return logits.float() if self.bf16 else logits

        self.network = stage_logits
        try:
            with self._single_output():
                return super().validation_step(batch)
        finally:
            self.network = network
