"""Our trainers' recipes: every setting a trainer reads, in one typed, validated dataclass.

``ScheduleRecipe`` is read by every trainer of ours, the seeded nnU-Net baselines too; ``DispersiveRecipe``,
``MedDisSegRecipe`` and ``PaperScheduleRecipe`` are those of ``nnUNetTrainerDispersive``, ``nnUNetTrainerMedDisSeg`` and
``nnUNetTrainerMedDisSeg_paper``. A trainer class holds its recipe in ``recipe``; ``trainer.recipe`` adds the overrides
the plans hold under ``RECIPE_PLANS_KEY`` (``nnUNetv2_meddisseg_plan --recipe FILE``, ``nnUNetv2_meddisseg_ablate``), so
``-p`` chooses the run's settings and ``plans.json`` records them. Every value is checked when a recipe is made,
``replace`` too: a ``ValueError`` naming the field and what it expects.
"""
import json
import math
from dataclasses import dataclass, fields, replace
from typing import Mapping, Optional, TypeVar

from nnunetv2_meddisseg.losses import DISPERSIVE_PLACEMENTS, DISPERSIVE_VARIANTS, DispersiveLoss
from nnunetv2_meddisseg.training.errors import TrainingInputError

__all__ = ["ScheduleRecipe", "DispersiveTermRecipe", "DispersiveRecipe", "MedDisSegRecipe", "PaperScheduleRecipe",
           "dispersive_from_recipe", "apply_overrides", "read_override_file", "recipe_from_plans",
           "recipe_summary", "RECIPE_PLANS_KEY", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "sgd")
#: the plans' top-level key of the recipe overrides (an object of setting name -> value)
RECIPE_PLANS_KEY = "meddisseg_recipe"

R = TypeVar("R", bound="ScheduleRecipe")


def _fail(recipe: object, name: str, expected: str, value: object) -> None:
    raise ValueError(f"{type(recipe).__name__}.{name} must be {expected}, got {value!r}")


def _number(recipe, name, low, high=None, low_open=False, high_open=False) -> None:
    value = getattr(recipe, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        expected = f"a finite number {'>' if low_open else '>='} {low}"
        if high is not None:
            expected += f" and {'<' if high_open else '<='} {high}"
        _fail(recipe, name, expected, value)


def _integer(recipe, name, low, optional=False) -> None:
    value = getattr(recipe, name)
    if value is None and optional:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
        _fail(recipe, name, f"an integer >= {low}" + (" (or null)" if optional else ""), value)


def _boolean(recipe, name, optional=False) -> None:
    value = getattr(recipe, name)
    if not (isinstance(value, bool) or (value is None and optional)):
        _fail(recipe, name, "true or false" + (" (or null)" if optional else ""), value)


def _choice(recipe, name, choices) -> None:
    if getattr(recipe, name) not in choices:
        _fail(recipe, name, f"one of {tuple(choices)}", getattr(recipe, name))


@dataclass(frozen=True)
class ScheduleRecipe:
    """A run's schedule; None keeps nnU-Net's: 1000 epochs of 250 + 50 validation iterations, a checkpoint every 50."""

    #: epochs of the run
    num_epochs: Optional[int] = None
    #: training iterations (batches) per epoch
    iterations_per_epoch: Optional[int] = None
    #: validation iterations (batches) per epoch (nnU-Net's online pseudo Dice)
    val_iterations_per_epoch: Optional[int] = None
    #: ``checkpoint_latest.pth`` every this many epochs
    save_every: Optional[int] = None
    #: nnU-Net's final validation of the fold's cases (False: skipped, and logged so)
    final_validation: bool = True
    #: ``torch.set_num_threads`` at construction (None: torch's default)
    torch_threads: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("num_epochs", "iterations_per_epoch", "val_iterations_per_epoch", "save_every", "torch_threads"):
            _integer(self, name, 1, optional=True)
        _boolean(self, "final_validation")

    @classmethod
    def field_names(cls) -> tuple:
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class DispersiveTermRecipe(ScheduleRecipe):
    """The dispersive loss's form (``losses.dispersive``); the subclasses hold its weights."""

    #: the loss form: infonce_l2 (the paper's), infonce_cosine, infonce_cosine_centred, hinge, covariance
    dispersive_variant: str = "infonce_l2"
    #: temperature tau of the InfoNCE forms (the paper's 0.8)
    dispersive_tau: float = 0.8
    #: eps inside the InfoNCE forms' log
    dispersive_eps: float = 1e-8
    #: margin of the hinge form
    dispersive_margin: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _choice(self, "dispersive_variant", DISPERSIVE_VARIANTS)
        for name in ("dispersive_tau", "dispersive_eps", "dispersive_margin"):
            _number(self, name, 0, low_open=True)


@dataclass(frozen=True)
class DispersiveRecipe(DispersiveTermRecipe):
    """``nnUNetTrainerDispersive``: nnU-Net's loss + ``lambda_dispersive * dispersive_loss(encoder.stages[0] output)``.
    Centred cosine by default: raw features lower InfoNCE-L2 by growing, the uncentred cosine by shrinking."""

    #: weight lambda of the dispersive term (0.2: the paper's Stage I value, for a network trained from scratch)
    lambda_dispersive: float = 0.2
    dispersive_variant: str = "infonce_cosine_centred"

    def __post_init__(self) -> None:
        super().__post_init__()
        _number(self, "lambda_dispersive", 0)


@dataclass(frozen=True)
class MedDisSegRecipe(DispersiveTermRecipe):
    """``nnUNetTrainerMedDisSeg``; the paper's defaults assume an ImageNet encoder (``scratch*`` variants differ)."""

    #: Stage I length as a fraction of ``num_epochs`` (``floor(stage1_fraction * num_epochs)`` epochs)
    stage1_fraction: float = 0.25
    #: Stage I length in epochs; None: from ``stage1_fraction``
    stage1_epochs: Optional[int] = None
    #: "adam" (the paper's) or "sgd" (nnU-Net's Nesterov SGD)
    optimizer: str = "adam"
    #: Stage I learning rate of both groups (Stage I head; encoder + ELAT)
    stage1_lr: float = 1e-4
    #: Stage II learning rate of the decoder group (everything but encoder + ELAT)
    stage2_lr: float = 1e-4
    #: Stage II learning rate of the encoder group (ResNet-50 + ELAT)
    stage2_encoder_lr: float = 1e-5
    #: Adam's weight decay
    adam_weight_decay: float = 0.0
    #: SGD's momentum (Nesterov) and weight decay (nnU-Net's)
    sgd_momentum: float = 0.99
    sgd_weight_decay: float = 3e-5
    #: exponent of the polynomial learning-rate decay within each stage
    lr_exponent: float = 0.9
    #: weight lambda of the dispersive term in Stage I (per view, clean and perturbed)
    lambda_dispersive_stage1: float = 0.2
    #: weight lambda of the dispersive term in Stage II
    lambda_dispersive_stage2: float = 0.6
    dispersive_variant: str = "infonce_l2"
    #: "early" (ELAT-refined layer1 x2), "middle" (x4), "late" (last feature before the logits), "all" (their mean)
    dispersive_placement: str = "early"
    #: Stage I weight of the consistency term between the clean and the perturbed view's logits
    consistency_weight: float = 1.0
    #: Stage II weight of the mean Dice+CE of the three decoder paths (0: final logits only, as the released code)
    path_supervision_weight: float = 0.5
    #: Stage II weight of the foreground / background loss
    fg_bg_weight: float = 1.0
    #: Stage II weight of the complementarity loss of the fg / bg / uncertainty maps
    complementarity_weight: float = 1.0
    #: channels of the Stage I head
    stage1_head_width: int = 64
    #: Stage I perturbation: colour (True) or channel-wise intensity (False); None: colour where ``channels_are_rgb``
    photometric_rgb: Optional[bool] = None
    #: training samples to re-estimate BatchNorm's running statistics on before every validation (0: keep training's)
    batchnorm_calibration_samples: int = 0
    #: draw those samples through nnU-Net's training augmentation (True) or as plain patches
    batchnorm_calibration_augmentation: bool = True
    #: also keep the end-of-Stage-I model as ``checkpoint_stage1.pth``
    stage1_checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _number(self, "stage1_fraction", 0, 1)
        _integer(self, "stage1_epochs", 0, optional=True)
        _choice(self, "optimizer", OPTIMIZERS)
        for name in ("stage1_lr", "stage2_lr", "stage2_encoder_lr", "lr_exponent"):
            _number(self, name, 0, low_open=True)
        for name in ("adam_weight_decay", "sgd_weight_decay", "consistency_weight", "path_supervision_weight",
                     "fg_bg_weight", "complementarity_weight"):
            _number(self, name, 0)
        _number(self, "sgd_momentum", 0, 1, high_open=True)
        _number(self, "lambda_dispersive_stage1", 0)
        _number(self, "lambda_dispersive_stage2", 0)
        _choice(self, "dispersive_placement", DISPERSIVE_PLACEMENTS + ("all",))
        _integer(self, "stage1_head_width", 1)
        _boolean(self, "photometric_rgb", optional=True)
        _integer(self, "batchnorm_calibration_samples", 0)
        _boolean(self, "batchnorm_calibration_augmentation")
        _boolean(self, "stage1_checkpoint")


@dataclass(frozen=True)
class PaperScheduleRecipe(MedDisSegRecipe):
    """``nnUNetTrainerMedDisSeg_paper``: 300 epochs, each one pass over the fold; early stopping; flip / rotation."""

    num_epochs: Optional[int] = 300
    #: stop once nnU-Net's EMA pseudo Dice has not improved for this many Stage II epochs
    early_stopping_patience: int = 100
    #: probability of a random rotation (nnU-Net's 2d angle range); flips are always drawn
    rotation_probability: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        _integer(self, "early_stopping_patience", 1)
        _number(self, "rotation_probability", 0, 1)


def dispersive_from_recipe(recipe: DispersiveTermRecipe, gather: bool = True) -> DispersiveLoss:
    """The recipe's unweighted dispersive loss, at "early" but for Med-DisSeg; ``gather``: of every process's batch."""
    placement = recipe.dispersive_placement if isinstance(recipe, MedDisSegRecipe) else "early"
    return DispersiveLoss(recipe.dispersive_variant, recipe.dispersive_tau, eps=recipe.dispersive_eps,
                          margin=recipe.dispersive_margin, placement=placement, gather=gather)


def apply_overrides(recipe: R, overrides: Mapping[str, object], source: str) -> R:
    """``recipe`` with ``overrides`` (name -> value); a one-line ``ValueError`` naming ``source`` and the bad name."""
    known = recipe.field_names()
    for name in overrides:
        if name not in known:
            raise ValueError(f"{source}: unknown setting {name!r} for {type(recipe).__name__} "
                             f"(known: {', '.join(known)})")
    try:
        return replace(recipe, **overrides)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error}") from None


def read_override_file(path: str) -> dict:
    """The JSON object of recipe overrides in ``path``; a one-line ``ValueError`` naming the file otherwise."""
    try:
        with open(path) as f:
            overrides = json.load(f)
    except OSError as error:
        raise ValueError(f"{path}: cannot read the recipe file: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a JSON file of recipe settings ({error})") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"{path}: expected a JSON object of recipe settings, got {type(overrides).__name__}")
    return overrides


def recipe_from_plans(recipe: R, plans: Mapping[str, object]) -> R:
    """``recipe`` with the overrides ``plans`` holds under ``RECIPE_PLANS_KEY``. An unknown setting is an error, so a
    budget never silently misses a trainer; errors are ``TrainingInputError``s naming the plans and the key."""
    overrides = plans.get(RECIPE_PLANS_KEY)
    if overrides is None:
        return recipe
    source = f"plans {plans.get('plans_name', '')!s}: {RECIPE_PLANS_KEY}"
    if not isinstance(overrides, dict):
        raise TrainingInputError(f"{source}: expected an object of recipe settings, got {type(overrides).__name__}")
    try:
        return apply_overrides(recipe, overrides, source)
    except ValueError as error:
        raise TrainingInputError(str(error)) from None


def recipe_summary(recipe: ScheduleRecipe) -> str:
    """``name=value`` of every setting that differs from the recipe class's defaults."""
    default = type(recipe)()
    changed = [f"{f.name}={getattr(recipe, f.name)!r}" for f in fields(recipe)
               if getattr(recipe, f.name) != getattr(default, f.name)]
    return ", ".join(changed) if changed else "the defaults"

