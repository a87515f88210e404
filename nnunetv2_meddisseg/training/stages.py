"""Med-DisSeg's two training stages as objects: everything that differs between them lives here.

``nnUNetTrainerMedDisSeg`` holds one (``trainer.stage``) and delegates to it. A stage is made with what is fixed for the
run and reads nothing else of the trainer; each call is passed the model to run, since the trainer's network may be
wrapped by DDP or torch.compile.
"""
from typing import Dict, List, Mapping, Optional

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
    """The stage a checkpoint records; a ``ValueError`` saying why where it cannot be resumed in one."""
    name = checkpoint.get("meddisseg_stage")
    if name is None:
        raise ValueError("it records no Med-DisSeg stage ('meddisseg_stage')")
    if name not in STAGE_NAMES:
        raise ValueError(f"it records an unknown Med-DisSeg stage {name!r} (expected {STAGE_1!r} or {STAGE_2!r})")
    if name == STAGE_1 and "stage1_head_weights" not in checkpoint:
        raise ValueError("a Stage I checkpoint without 'stage1_head_weights' cannot be resumed")
    return name


class Stage:
    """What one stage decides; ``Stage1`` and ``Stage2`` fill it in. ``network``: the plain MedDisSegNet; ``seg``:
    nnU-Net's Dice + CE. Its rates decay over its epochs, ``[first_epoch, first_epoch + num_epochs)``."""

    name: str = ""
    #: the stage's number (the ``stage`` curve) and as the log writes it
    number: int = 0
    numeral: str = ""
    #: its networks may become ``checkpoint_best.pth``; one that never reached such a stage has an untrained decoder
    trains_whole_network: bool = False
    #: the name of the stage's compiled training graph (the log's ``torch.compile: graph ...`` line)
    graph: str = ""
    #: the step's loss, ``objectives``: (model, data (B, C, H, W), target (B, 1, H, W)) -> (total, terms, features)
    loss: nn.Module

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, first_epoch: int, num_epochs: int):
        self.network, self.recipe = network, recipe
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
        """The optimizer's groups (``name``, ``params``, ``lr``); names label the ``lr_*``, ``grad_norm_*`` curves."""
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
        """Load what ``checkpoint_extras`` wrote."""

    def batchnorm_modules(self) -> List[nn.Module]:
        """The plain modules whose BatchNorm statistics describe this stage's model."""
        return [self.network]


class Stage1(Stage):
    """Stage I: encoder + ELAT with a light head on both views (``objectives.Stage1Loss``); groups ``head`` and
    ``encoder`` at ``stage1_lr``. ``distributed``: DDP-wrapped, so the idle decoder enters the loss with weight 0."""

    name, number, numeral, graph = STAGE_1, 1, "I", "Stage I training"
    #: where the recipe's ``stage1_checkpoint`` keeps the model at the end of Stage I
    CHECKPOINT = "checkpoint_stage1.pth"

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, seg: nn.Module, dispersive: DispersiveLoss,
                 first_epoch: int, num_epochs: int, head: nn.Module, rgb: bool, distributed: bool = False):
        super().__init__(network, recipe, first_epoch, num_epochs)
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
    """Stage II: the full network with deep supervision (``objectives.Stage2Loss``); groups ``decoder`` (all but
    encoder + ELAT) and ``encoder`` (encoder + ELAT, at a lower rate). ``ignore_label``: nnU-Net's, or None."""

    name, number, numeral, graph = STAGE_2, 2, "II", "Stage II training"
    trains_whole_network = True

    def __init__(self, network: MedDisSegNet, recipe: MedDisSegRecipe, seg: nn.Module, dispersive: DispersiveLoss,
                 first_epoch: int, num_epochs: int, ignore_label: Optional[int] = None):
        super().__init__(network, recipe, first_epoch, num_epochs)
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
