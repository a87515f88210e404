"""The Stage II objective of nnUNetTrainerMedDisSeg, as functions the trainer and the benchmarks share.

``stage2_loss`` is what ``nnUNetTrainerMedDisSeg`` minimises in Stage II; ``segmentation_loss`` builds
its ``seg`` term, which the trainer takes from nnU-Net's ``_build_loss`` (Dice + CE, no deep-supervision
wrapper), for code outside a trainer;
``Stage2Weights.from_recipe`` and ``dispersive_from_recipe`` read a trainer's recipe, so that code
outside the trainer (e.g. the training-step benchmark) computes exactly the trainer's loss.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor, nn
from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss

from nnunetv2_meddisseg.architectures import MedDisSegOutput
from nnunetv2_meddisseg.losses import DispersiveLoss, complementarity_loss, foreground_background_loss
from nnunetv2_meddisseg.losses.segmentation import dice_ce_per_output, dice_ce_settings
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe

__all__ = ["Stage2Weights", "dispersive_from_recipe", "segmentation_loss", "foreground_target", "stage2_loss"]


@dataclass(frozen=True)
class Stage2Weights:
    """Weights of the Stage II terms."""

    path_supervision: float
    fg_bg: float
    complementarity: float
    dispersive: float

    @classmethod
    def from_recipe(cls, recipe: MedDisSegRecipe) -> "Stage2Weights":
        """The weights a recipe sets: ``path_supervision_weight``, ``fg_bg_weight``, ``complementarity_weight``,
        ``lambda_dispersive_stage2``."""
        return cls(path_supervision=recipe.path_supervision_weight, fg_bg=recipe.fg_bg_weight,
                   complementarity=recipe.complementarity_weight, dispersive=recipe.lambda_dispersive_stage2)


def dispersive_from_recipe(recipe: MedDisSegRecipe, gather: bool = True) -> DispersiveLoss:
    """The (unweighted) dispersive loss a recipe sets: ``dispersive_variant``, ``dispersive_tau``,
    ``dispersive_eps``, ``dispersive_margin``, ``dispersive_placement``; ``gather``: under DDP, the batch of
    every process (the trainer's ``dispersive_gather``). Both stages use it."""
    return DispersiveLoss(recipe.dispersive_variant, recipe.dispersive_tau, eps=recipe.dispersive_eps,
                          margin=recipe.dispersive_margin, placement=recipe.dispersive_placement, gather=gather)


def segmentation_loss(batch_dice: bool, ignore_label: Optional[int] = None, ddp: bool = False) -> nn.Module:
    """nnU-Net's Dice + CE (``MemoryEfficientSoftDiceLoss``, no background in the Dice, smooth 1e-5).

    forward(logits (B, K, H, W), target (B, 1, H, W) label map) -> 0-dim tensor.
    """
    return DC_and_CE_loss({"batch_dice": batch_dice, "smooth": 1e-5, "do_bg": False, "ddp": ddp}, {},
                          weight_ce=1, weight_dice=1, ignore_label=ignore_label,
                          dice_class=MemoryEfficientSoftDiceLoss)


def foreground_target(target: Tensor, ignore_label: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """target: (B, 1, H, W) label map -> ``(foreground, mask)``, both (B, 1, H, W) float.

    ``foreground`` is 1 where any foreground class is; ``mask`` is None without an ignore label,
    else 0 where the label is ``ignore_label`` (such pixels are neither foreground nor background).
    """
    if ignore_label is None:
        return (target > 0).float(), None
    labelled = target != ignore_label
    return ((target > 0) & labelled).float(), labelled.float()


def stage2_loss(output: MedDisSegOutput, target: Tensor, seg_loss: Callable[[Tensor, Tensor], Tensor],
                dispersive: Optional[Callable[[Mapping[str, Tensor]], Tensor]], weights: Stage2Weights,
                ignore_label: Optional[int] = None) -> Tuple[Tensor, Dict[str, Tensor]]:
    """The Stage II loss of one batch::

        seg(logits) + path_supervision * mean(seg(O_S), seg(O_M), seg(O_L))
        + fg_bg * foreground_background_loss(fg, bg, any foreground class, labelled pixels)
        + complementarity * complementarity_loss(fg, bg, uc) + dispersive * dispersive(features)

    output: the network's training output (auxiliary maps present); target: (B, 1, H, W) label map.
    Where ``seg_loss`` is nnU-Net's Dice + CE (``losses.segmentation.dice_ce_settings``), the four maps are
    scored in one pass (same values), else ``seg_loss`` is called on each.
    ``dispersive`` None leaves that term out; the path term is left out when its weight is 0 or the
    output has no path logits. Returns ``(total, terms)``, terms holding each unweighted term by name
    (``seg``, ``seg_paths``, ``fg_bg``, ``complementarity``, ``dispersive``).
    """
    if not isinstance(output, MedDisSegOutput) or output.fg is None:
        raise RuntimeError("Stage II expects MedDisSegOutput with auxiliary maps: the network must be in "
                           "training mode with decoder.deep_supervision = True")
    with_paths = bool(weights.path_supervision) and output.path_logits is not None
    settings = dice_ce_settings(seg_loss) if with_paths else None
    if settings is not None:  # nnU-Net's Dice + CE of the four maps in one pass
        per_output = dice_ce_per_output([output.logits, *output.path_logits], target, **settings)
        seg, paths = per_output[0], per_output[1:].mean()
    else:
        seg = seg_loss(output.logits, target)
        paths = torch.stack([seg_loss(p, target) for p in output.path_logits]).mean() if with_paths else None
    terms: Dict[str, Tensor] = {"seg": seg}
    total = seg
    if with_paths:
        terms["seg_paths"] = paths
        total = total + weights.path_supervision * paths
    foreground, mask = foreground_target(target, ignore_label)
    terms["fg_bg"] = foreground_background_loss(output.fg, output.bg, foreground, mask)
    terms["complementarity"] = complementarity_loss(output.fg, output.bg, output.uc)
    total = total + weights.fg_bg * terms["fg_bg"] + weights.complementarity * terms["complementarity"]
    if dispersive is not None:
        terms["dispersive"] = dispersive(output.features)
        total = total + weights.dispersive * terms["dispersive"]
    return total, terms
