"""Med-DisSeg's two training stages as objects: everything that differs between them lives here.

``nnUNetTrainerMedDisSeg`` holds one stage (``trainer.stage``) and delegates to it: which output of the network
it trains and validates (``forward``'s ``output``), the optimizer's parameter groups and
their learning rates, the epochs the stage's schedule spans, the loss of a training step, the logits validation
scores, what a checkpoint adds, which modules' BatchNorm statistics are re-estimated, and whether the stage's
networks may become ``checkpoint_best.pth``.

- :class:`Stage1` (epochs ``[0, stage1_epochs)``): the encoder with ELAT and a light head (``Stage1Head``) that
  turns the four ELAT-refined features into logits; every batch is also seen under a strong photometric
  perturbation (``photometric.photometric_perturbation``); both groups (head, encoder + ELAT) at ``stage1_lr``.
- :class:`Stage2` (epochs ``[stage1_epochs, num_epochs)``): the full network with deep supervision; the encoder
  + ELAT at ``stage2_encoder_lr``, everything else at ``stage2_lr``.

The losses themselves are modules (``objectives``), built once when the stage is made: ``stage.loss(model, data,
target)``. A stage is made with what is fixed for the run (the plain network, the recipe, nnU-Net's Dice + CE, the
dispersive loss, its epochs and its own parts) and told the model to run when it is called (the trainer's network
may be wrapped by DDP or torch.compile); it reads nothing else of the trainer.
"""
from typing import Dict, List, Mapping, Optional, Tuple

from torch import Tensor, nn

from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.losses import DispersiveLoss
from nnunetv2_meddisseg.module_wrappers import unwrap_module
from nnunetv2_meddisseg.training.objectives import Stage1Loss, Stage2Loss, Stage2Weights, stage1_logits
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe

__all__ = ["STAGE_1", "STAGE_2", "STAGE_NAMES", "Stage", "Stage1", "Stage2", "checkpoint_stage"]

#: the stages' names as checkpoints store them (``meddisseg_stage``)
STAGE_1 = "stage1"
STAGE_2 = "stage2"
STAGE_NAMES = (STAGE_1, STAGE_2)


def checkpoint_stage(checkpoint: Mapping[str, object]) -> str:
    """The stage a checkpoint records (``meddisseg_stage``); a ``ValueError`` saying what is wrong where the
    checkpoint cannot be resumed in a stage."""
    name = checkpoint.get("meddisseg_stage")
    if name is None:
        raise ValueError("it records no Med-DisSeg stage ('meddisseg_stage')")
    if name not in STAGE_NAMES:
        raise ValueError(f"it records an unknown Med-DisSeg stage {name!r} (expected {STAGE_1!r} or {STAGE_2!r})")
    if name == STAGE_1 and "stage1_head_weights" not in checkpoint:
        raise ValueError("a Stage I checkpoint without 'stage1_head_weights' cannot be resumed")
    return name


class Stage:
    """What one stage decides; :class:`Stage1` and :class:`Stage2` fill it in.

    Args:
        network: the plain MedDisSegNet (no DDP / compile wrapper).
        recipe: the trainer's recipe (learning rates, loss weights).
        seg: nnU-Net's Dice + CE (the trainer's ``loss``): logits (B, K, H, W), target (B, 1, H, W) -> 0-dim.
        dispersive: the (unweighted) dispersive loss of the recipe (``recipe.dispersive_from_recipe``).
        first_epoch, num_epochs: the epochs ``[first_epoch, first_epoch + num_epochs)`` the stage spans; its
            learning rates decay over them.
    """

    name: str = ""
    #: the stage's number (the ``stage`` curve) and as the log writes it
    number: int = 0
    numeral: str = ""
    #: the stage trains the whole network: its networks may become ``checkpoint_best.pth`` (and count towards the
    #: best EMA pseudo Dice); a network that never reached such a stage has an untrained decoder
    trains_whole_network: bool = False
    #: the names of the optimizer's groups (the ``lr_<name>`` and ``grad_norm_<name>`` curves)
    group_names: Tuple[str, ...] = ()
    #: the name of the stage's compiled training graph (the log's ``torch.compile: graph ...`` line)
    graph: str = ""
    #: the loss of one training step (``objectives``): loss(model, data (B, C, H, W), target (B, 1, H, W)) ->
    #: (total, the unweighted terms by name, the features of the first regularised layer for the diagnostics);
    #: ``model`` is the network to call (possibly wrapped)
    loss: nn.Module

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, seg: nn.Module, dispersive: DispersiveLoss,
                 first_epoch: int, num_epochs: int):
        self.network, self.recipe, self.seg, self.dispersive = network, recipe, seg, dispersive
        self.first_epoch, self.num_epochs = int(first_epoch), int(num_epochs)

    @property
    def last_epoch(self) -> int:
        return self.first_epoch + self.num_epochs - 1

    def describe(self) -> str:
        """What the stage trains and at which learning rates, for the log."""
        raise NotImplementedError

    def end_checkpoint(self) -> Optional[str]:
        """The file name of a copy of the model kept at the end of this stage, or None."""
        return None

    def parameter_groups(self) -> List[dict]:
        """The optimizer's groups (``name``, ``params``, ``lr``), named as :attr:`group_names` says."""
        raise NotImplementedError

    def validation_logits(self, model: nn.Module, data: Tensor, plain: bool = False) -> Tensor:
        """Logits (B, K, H, W) of this stage's model for data (B, C, H, W); ``plain``: the unwrapped modules."""
        raise NotImplementedError

    def set_training(self, training: bool) -> None:
        """Training or evaluation mode for what the stage owns besides the network."""

    def checkpoint_extras(self) -> Dict[str, object]:
        """What this stage adds to a checkpoint."""
        return {"meddisseg_stage": self.name}

    def restore(self, checkpoint: Mapping[str, object]) -> None:
        """Load what :meth:`checkpoint_extras` wrote."""

    def batchnorm_modules(self) -> List[nn.Module]:
        """The plain modules whose BatchNorm statistics describe this stage's model."""
        return [self.network]


class Stage1(Stage):
    """Stage I: encoder + ELAT with a light head, clean and photometrically perturbed views
    (``objectives.Stage1Loss``); the optimizer's groups ``head`` and ``encoder`` (encoder + ELAT).

    Args:
        head: the head to call (``Stage1Head``, possibly wrapped by DDP).
        rgb: colour perturbations (RGB input) instead of channel-wise intensity ones.
        distributed: the model is DDP-wrapped: the idle decoder enters the loss with weight 0 (DDP's reducer
            expects a gradient for every parameter).
    """

    name, number, numeral, graph = STAGE_1, 1, "I", "Stage I training"
    group_names = ("head", "encoder")
    #: where the recipe's ``stage1_checkpoint`` keeps the model at the end of Stage I
    CHECKPOINT = "checkpoint_stage1.pth"

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, seg: nn.Module, dispersive: DispersiveLoss,
                 first_epoch: int, num_epochs: int, head: nn.Module, rgb: bool, distributed: bool = False):
        super().__init__(network, recipe, seg, dispersive, first_epoch, num_epochs)
        self.head = head
        idle = [p for p in network.non_encoder_parameters() if p.requires_grad] if distributed else None
        self.loss = Stage1Loss(head, seg, dispersive, recipe, rgb, idle)

    @property
    def plain_head(self) -> nn.Module:
        return unwrap_module(self.head)

    def describe(self) -> str:
        return f"encoder + ELAT with a light head, {self.recipe.optimizer} lr {self.recipe.stage1_lr}"

    def end_checkpoint(self) -> Optional[str]:
        return self.CHECKPOINT if self.recipe.stage1_checkpoint else None

    def parameter_groups(self) -> List[dict]:
        lr = self.recipe.stage1_lr
        return [{"name": "head", "params": list(self.plain_head.parameters()), "lr": lr},
                {"name": "encoder", "params": list(self.network.encoder_parameters()), "lr": lr}]

    def validation_logits(self, model: nn.Module, data: Tensor, plain: bool = False) -> Tensor:
        head = self.plain_head if plain else self.head
        return stage1_logits(head, model(data, output="encoder"), data.shape[-2:])[0]

    def set_training(self, training: bool) -> None:
        self.head.train(training)

    def checkpoint_extras(self) -> Dict[str, object]:
        return {**super().checkpoint_extras(), "stage1_head_weights": self.plain_head.state_dict()}

    def restore(self, checkpoint: Mapping[str, object]) -> None:
        self.plain_head.load_state_dict(checkpoint["stage1_head_weights"])

    def batchnorm_modules(self) -> List[nn.Module]:
        return [self.network, self.plain_head]


class Stage2(Stage):
    """Stage II: the full network with deep supervision (``objectives.Stage2Loss``, its weights read from the
    recipe once); the optimizer's groups ``decoder`` (everything but encoder + ELAT) and ``encoder`` (encoder + ELAT,
    at a lower learning rate).

    Args:
        ignore_label: nnU-Net's ignore label (such pixels count in no term of the fg/bg maps), or None.
    """

    name, number, numeral, graph = STAGE_2, 2, "II", "Stage II training"
    trains_whole_network = True
    group_names = ("decoder", "encoder")

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, seg: nn.Module, dispersive: DispersiveLoss,
                 first_epoch: int, num_epochs: int, ignore_label: Optional[int] = None):
        super().__init__(network, recipe, seg, dispersive, first_epoch, num_epochs)
        self.loss = Stage2Loss(seg, dispersive, Stage2Weights.from_recipe(recipe), ignore_label)

    def describe(self) -> str:
        recipe = self.recipe
        return (f"full network, {recipe.optimizer} lr {recipe.stage2_encoder_lr} (encoder + ELAT) / {recipe.stage2_lr} "
                f"(rest)")

    def parameter_groups(self) -> List[dict]:
        recipe = self.recipe
        return [{"name": "decoder", "params": list(self.network.non_encoder_parameters()), "lr": recipe.stage2_lr},
                {"name": "encoder", "params": list(self.network.encoder_parameters()),
                 "lr": recipe.stage2_encoder_lr}]

    def validation_logits(self, model: nn.Module, data: Tensor, plain: bool = False) -> Tensor:
        return model(data)
