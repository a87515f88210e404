"""Med-DisSeg's objectives: the loss of one training step in each stage, built once by ``training.stages``.

Stage I (``Stage1Loss``): a light head (``Stage1Head``) turns the four ELAT-refined encoder features into logits.
Clean and photometrically perturbed views go through the network as one batch of 2B (one forward, so both views
share BatchNorm statistics and DDP sees a single forward). Loss::

    seg(clean) + seg(perturbed) + consistency_weight * consistency(clean, perturbed)
    + lambda_dispersive_stage1 * (dispersive(clean) + dispersive(perturbed))

Stage II (``Stage2Loss``): the full network returns every output (``output="all"``, a ``MedDisSegOutput``)::

    seg(logits) + path_supervision_weight * mean(seg(O_S), seg(O_M), seg(O_L))
    + fg_bg_weight * foreground_background_loss(fg, bg, any foreground class)
    + complementarity_weight * complementarity_loss(fg, bg, uc)
    + lambda_dispersive_stage2 * dispersive

Every output is at full resolution, so nnU-Net's deep supervision is off; instead each decoder path (their sum is
the final logits) gets the same Dice + CE, so every path predicts on its own. Ignore-label pixels count in no fg/bg
term. Both return (total, the unweighted terms by name, the features of the first regularised layer, for diagnostics).
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
from torch import Tensor, nn

from nnunetv2_meddisseg.architectures import MedDisSegOutput
from nnunetv2_meddisseg.losses import DispersiveLoss, complementarity_loss, consistency_loss, foreground_background_loss
from nnunetv2_meddisseg.losses.segmentation import dice_ce_per_output, dice_ce_settings
from nnunetv2_meddisseg.training.photometric import photometric_perturbation
from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe, dispersive_from_recipe

__all__ = ["Stage2Weights", "segmentation_loss", "foreground_target", "Stage2Loss", "recipe_stage2_loss",
           "stage1_logits", "Stage1Loss"]


@dataclass(frozen=True)
class Stage2Weights:
    """Weights of the Stage II terms."""

    path_supervision: float
    fg_bg: float
    complementarity: float
    dispersive: float

    @classmethod
    def from_recipe(cls, recipe: MedDisSegRecipe) -> "Stage2Weights":
        """The weights ``recipe`` sets."""
        return cls(path_supervision=recipe.path_supervision_weight, fg_bg=recipe.fg_bg_weight,
                   complementarity=recipe.complementarity_weight, dispersive=recipe.lambda_dispersive_stage2)


def segmentation_loss(batch_dice: bool, ignore_label: Optional[int] = None, ddp: bool = False) -> nn.Module:
    """nnU-Net's Dice + CE: logits (B, K, H, W), target (B, 1, H, W) label map -> 0-dim tensor."""
    return DC_and_CE_loss({"batch_dice": batch_dice, "smooth": 1e-5, "do_bg": False, "ddp": ddp}, {},
                          weight_ce=1, weight_dice=1, ignore_label=ignore_label,
                          dice_class=MemoryEfficientSoftDiceLoss)


def foreground_target(target: Tensor, ignore_label: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """target: (B, 1, H, W) label map -> ``(foreground, mask)``, both (B, 1, H, W) float. ``mask`` is None without
    an ignore label, else 0 at ``ignore_label``: such pixels are neither foreground nor background."""
    if ignore_label is None:
        return (target > 0).float(), None
    labelled = target != ignore_label
    return ((target > 0) & labelled).float(), labelled.float()


class Stage2Loss(nn.Module):
    """The Stage II loss of one batch; ``forward(model, data (B, C, H, W), target (B, 1, H, W))``. Where ``seg`` is
    nnU-Net's Dice + CE, the four maps are scored in one pass (same values)."""

    def __init__(self, seg: Callable[[Tensor, Tensor], Tensor], dispersive: Optional[DispersiveLoss],
                 weights: Stage2Weights, ignore_label: Optional[int] = None):
        super().__init__()
        self.seg, self.dispersive, self.weights, self.ignore_label = seg, dispersive, weights, ignore_label
        self.settings = dice_ce_settings(seg) if weights.path_supervision else None
        self.diagnosed = dispersive.placements[0] if dispersive is not None else None

    def terms(self, output: MedDisSegOutput, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor]]:
        """(total, terms) of the network's every output (``output="all"``)."""
        weights = self.weights
        with_paths = bool(weights.path_supervision) and output.path_logits is not None
        if with_paths and self.settings is not None:
            per_output = dice_ce_per_output([output.logits, *output.path_logits], target, **self.settings)
            seg, paths = per_output[0], per_output[1:].mean()
        else:
            seg = self.seg(output.logits, target)
            paths = torch.stack([self.seg(p, target) for p in output.path_logits]).mean() if with_paths else None
        terms: Dict[str, Tensor] = {"seg": seg}
        total = seg
        if with_paths:
            terms["seg_paths"] = paths
            total = total + weights.path_supervision * paths
        foreground, mask = foreground_target(target, self.ignore_label)
        terms["fg_bg"] = foreground_background_loss(output.fg, output.bg, foreground, mask)
        terms["complementarity"] = complementarity_loss(output.fg, output.bg, output.uc)
        total = total + weights.fg_bg * terms["fg_bg"] + weights.complementarity * terms["complementarity"]
        if self.dispersive is not None:
            terms["dispersive"] = self.dispersive(output.features)
            total = total + weights.dispersive * terms["dispersive"]
        return total, terms

    def forward(self, model: nn.Module, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        output = model(data, output="all")
        total, terms = self.terms(output, target)
        return total, terms, output.features[self.diagnosed]


def recipe_stage2_loss(recipe: MedDisSegRecipe, dispersive: bool = True) -> Callable[[MedDisSegOutput, Tensor], Tensor]:
    """The trainer's Stage II loss of ``recipe`` as ``(network output, target) -> total``, with the batch Dice (as
    nnU-Net plans 2D) and, where ``dispersive``, the dispersive term; for code outside the trainer."""
    term = dispersive_from_recipe(recipe) if dispersive else None
    loss = Stage2Loss(segmentation_loss(batch_dice=True), term, Stage2Weights.from_recipe(recipe))
    return lambda output, target: loss.terms(output, target)[0]


def stage1_logits(head: nn.Module, features: Sequence[Tensor], size: Sequence[int]) -> Tuple[Tensor, Tensor]:
    """(logits cropped to ``size`` (H, W), the head's fused feature) of the Stage I head on the network's features."""
    padded = (2 * features[0].shape[-2], 2 * features[0].shape[-1])
    logits, fused = head(features, padded)
    return logits[..., :size[0], :size[1]], fused


class Stage1Loss(nn.Module):
    """The Stage I loss of clean ``data`` (B, C, H, W) and its perturbed view (colour if ``rgb``, else channel-wise).
    ``idle_parameters`` (DDP): the decoder's trainable ones at weight 0: DDP's reducer expects a gradient for each."""

    def __init__(self, head: nn.Module, seg: nn.Module, dispersive: DispersiveLoss, recipe: MedDisSegRecipe,
                 rgb: bool, idle_parameters: Optional[Sequence[nn.Parameter]] = None):
        super().__init__()
        self.head, self.seg, self.dispersive, self.rgb, self.idle_parameters = (head, seg, dispersive, rgb,
                                                                                idle_parameters)
        self.consistency_weight, self.dispersive_weight = recipe.consistency_weight, recipe.lambda_dispersive_stage1
        self.diagnosed = dispersive.placements[0]

    def forward(self, model: nn.Module, data: Tensor, target: Tensor) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
        b = data.shape[0]
        perturbed = photometric_perturbation(data, rgb=self.rgb)
        features = model(torch.cat([data, perturbed], dim=0), output="encoder")
        logits, fused = stage1_logits(self.head, features, data.shape[-2:])
        views = [{"early": features[1][half], "middle": features[3][half], "late": fused[half]}
                 for half in (slice(0, b), slice(b, 2 * b))]
        seg_clean = self.seg(logits[:b], target)
        seg_perturbed = self.seg(logits[b:], target)
        consistency = consistency_loss(logits[:b], logits[b:])
        dispersive_total = self.dispersive(views[0]) + self.dispersive(views[1])
        total = (seg_clean + seg_perturbed + self.consistency_weight * consistency
                 + self.dispersive_weight * dispersive_total)
        if self.idle_parameters is not None:
            total = total + 0.0 * sum(p.sum() for p in self.idle_parameters)
        terms = {"seg": seg_clean, "seg_perturbed": seg_perturbed, "consistency": consistency,
                 "dispersive": dispersive_total}
        return total, terms, views[0][self.diagnosed]
