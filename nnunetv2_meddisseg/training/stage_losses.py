"""The names of Med-DisSeg's two training stages and the loss of one training step in each.

Stage I (``stage1_losses``): the network runs with ``encoder_only = True`` and a light head (``Stage1Head``)
turns the four ELAT-refined features into logits. Clean and photometrically perturbed views go through the
network as one batch of 2B (one forward, so BatchNorm statistics are shared by both views and DDP sees a
single forward). Loss::

    seg(clean) + seg(perturbed) + consistency_weight * consistency(clean, perturbed)
    + lambda_dispersive_stage1 * (dispersive(clean) + dispersive(perturbed))

Stage II (``stage2_losses``): the full network with deep supervision, returning a ``MedDisSegOutput``; its
loss is ``stage2_loss.stage2_loss``::

    seg(logits) + path_supervision_weight * mean(seg(O_S), seg(O_M), seg(O_L))
    + fg_bg_weight * foreground_background_loss(fg, bg, any foreground class)
    + complementarity_weight * complementarity_loss(fg, bg, uc)
    + lambda_dispersive_stage2 * dispersive

Deep supervision in Stage II: nnU-Net's multi-resolution deep supervision does not apply (all outputs are at
full resolution), so the trainer's ``_get_deep_supervision_scales`` returns None and the dataloader yields
full-resolution targets. Instead, each of the three decoder paths (whose sum forms the final logits) is
supervised with the same Dice+CE, averaged and weighted 0.5, so that every path is a usable predictor on its
own (``path_supervision_weight = 0`` trains the final logits only, as the released code does). Pixels with
nnU-Net's ignore label count in no term of the fg/bg maps. ``seg`` is ``DC_and_CE_loss`` built as nnU-Net's
``_build_loss`` builds it, without the deep-supervision wrapper.

Each function returns (total loss, the unweighted terms by name, the features
of the dispersive loss's first regularised layer, for the diagnostics).
"""
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from nnunetv2_meddisseg.losses import DispersiveLoss, consistency_loss
from nnunetv2_meddisseg.training.stage2_loss import Stage2Weights, stage2_loss

__all__ = ["STAGE_1", "STAGE_2", "dispersion", "stage1_logits", "stage1_losses", "stage2_losses"]

STAGE_1 = "stage1"
STAGE_2 = "stage2"


def dispersion(dispersive: DispersiveLoss, features: Mapping[str, Tensor]) -> Tuple[Tensor, Tensor]:
    """(loss, features of the first regularised layer for the diagnostics)."""
    return dispersive(features), features[dispersive.placements[0]]


def stage1_logits(head: nn.Module, features: Sequence[Tensor], size: Sequence[int]) -> Tuple[Tensor, Tensor]:
    """(logits cropped to ``size`` (H, W), the head's fused feature) of the Stage I head on the network's features."""
    padded = (2 * features[0].shape[-2], 2 * features[0].shape[-1])
    logits, fused = head(features, padded)
    return logits[..., :size[0], :size[1]], fused


def stage1_losses(network: nn.Module, head: nn.Module, seg: nn.Module, dispersive: DispersiveLoss, recipe,
                  data: Tensor, perturbed: Tensor, target: Tensor,
                  idle_parameters: Optional[Iterable[nn.Parameter]] = None) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
    """Stage I loss of clean ``data`` and its ``perturbed`` view (see the module docstring). ``idle_parameters``
    (under DDP: the decoder's trainable parameters, idle in Stage I) enter the loss with weight 0, so that DDP's
    reducer, which expects a gradient for every parameter, completes."""
    b = data.shape[0]
    features = network(torch.cat([data, perturbed], dim=0))
    logits, fused = stage1_logits(head, features, data.shape[-2:])
    views = []
    for half in (slice(0, b), slice(b, 2 * b)):
        views.append({"early": features[1][half], "middle": features[3][half], "late": fused[half]})
    seg_clean = seg(logits[:b], target)
    seg_perturbed = seg(logits[b:], target)
    consistency = consistency_loss(logits[:b], logits[b:])
    dispersive_clean, diagnosed = dispersion(dispersive, views[0])
    dispersive_perturbed, _ = dispersion(dispersive, views[1])
    dispersive_total = dispersive_clean + dispersive_perturbed
    total = (seg_clean + seg_perturbed + recipe.consistency_weight * consistency
             + recipe.lambda_dispersive_stage1 * dispersive_total)
    if idle_parameters is not None:
        total = total + 0.0 * sum(p.sum() for p in idle_parameters)
    terms = {"seg": seg_clean, "seg_perturbed": seg_perturbed, "consistency": consistency,
             "dispersive": dispersive_total}
    return total, terms, diagnosed


def stage2_losses(network: nn.Module, seg: nn.Module, dispersive: DispersiveLoss, recipe, data: Tensor,
                  target: Tensor, ignore_label: Optional[int]) -> Tuple[Tensor, Dict[str, Tensor], Tensor]:
    """Stage II loss of ``data`` (see the module docstring; pixels with ``ignore_label`` count in no term of
    the fg/bg maps)."""
    output = network(data)
    total, terms = stage2_loss(output, target, seg, dispersive, Stage2Weights.from_recipe(recipe), ignore_label)
    return total, terms, output.features[dispersive.placements[0]]
