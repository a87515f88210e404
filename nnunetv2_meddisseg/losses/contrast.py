"""Losses of the contrast-driven auxiliary heads and of Stage I's consistency: logits in (``soft_dice_loss``:
probabilities), fp32, a 0-dim tensor out."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["soft_dice_loss", "dice_bce_loss", "foreground_background_loss", "complementarity_loss",
           "consistency_loss"]


def _check_same_shape(name: str, **tensors: Optional[Tensor]) -> None:
    shapes = {key: tuple(t.shape) for key, t in tensors.items() if t is not None}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"{name}: inputs must have the same shape, got {shapes}")


def soft_dice_loss(probabilities: Tensor, target: Tensor, smooth: float = 1.0, mask: Optional[Tensor] = None) -> Tensor:
    """1 - soft Dice per sample, averaged over the batch; probabilities, target: (B, ...) in [0, 1]. ``smooth``
    joins numerator and denominator (empty on empty: loss 0); pixels where ``mask`` is 0 are left out of every sum."""
    _check_same_shape("soft_dice_loss", probabilities=probabilities, target=target, mask=mask)
    p = probabilities.float().reshape(probabilities.shape[0], -1)
    t = target.float().reshape(target.shape[0], -1)
    if mask is not None:
        m = mask.float().reshape(mask.shape[0], -1)
        p, t = p * m, t * m
    intersection = (p * t).sum(dim=1)
    dice = (2.0 * intersection + smooth) / (p.sum(dim=1) + t.sum(dim=1) + smooth)
    return (1.0 - dice).mean()


def dice_bce_loss(logits: Tensor, target: Tensor, smooth: float = 1.0, mask: Optional[Tensor] = None) -> Tensor:
    """BCE (mean over pixels) + soft Dice loss of one binary map; logits and target (in [0, 1]): (B, 1, H, W).
    Pixels where ``mask`` is 0 count in neither term (BCE: the mean over the others, 0 when none is left)."""
    _check_same_shape("dice_bce_loss", logits=logits, target=target, mask=mask)
    logits = logits.float()
    target = target.float()
    if mask is None:
        bce = F.binary_cross_entropy_with_logits(logits, target)
    else:
        m = mask.float()
        per_pixel = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        bce = (per_pixel * m).sum() / m.sum().clamp_min(1.0)
    return bce + soft_dice_loss(torch.sigmoid(logits), target, smooth, mask)


def foreground_background_loss(fg_logits: Tensor, bg_logits: Tensor, fg_target: Tensor,
                               mask: Optional[Tensor] = None) -> Tensor:
    """Dice+BCE(fg, target) + Dice+BCE(bg, 1 - target) of the auxiliary maps, all (B, 1, H, W); fg_target in {0, 1}
    ("any foreground class"). ``mask`` is 0 at unlabelled pixels (nnU-Net's ignore label), which count in no term."""
    _check_same_shape("foreground_background_loss", fg_logits=fg_logits, bg_logits=bg_logits, fg_target=fg_target,
                      mask=mask)
    target = fg_target.float()
    # both maps as one batch of 2B: twice its mean Dice+BCE is the sum of the two maps' (equal sizes)
    both_masks = None if mask is None else torch.cat([mask, mask])
    return 2.0 * dice_bce_loss(torch.cat([fg_logits, bg_logits]), torch.cat([target, 1.0 - target]), mask=both_masks)


def complementarity_loss(fg_logits: Tensor, bg_logits: Tensor, uc_logits: Tensor) -> Tensor:
    """Pushes every pixel to be claimed by exactly one of foreground, background, uncertainty (each (B, 1, H, W)):
    with ``(p_f, p_b, p_u)`` the pixel's softmax over the three maps, the mean of ``p_f p_b + p_f p_u + p_b p_u`` (0
    one-hot, 1/3 for equal logits), computed as ``(1 - p_f^2 - p_b^2 - p_u^2) / 2`` since they sum to 1."""
    _check_same_shape("complementarity_loss", fg_logits=fg_logits, bg_logits=bg_logits, uc_logits=uc_logits)
    p = torch.softmax(torch.stack([fg_logits.float(), bg_logits.float(), uc_logits.float()], dim=0), dim=0)
    return 0.5 - 0.5 * p.square().sum(dim=0).mean()


def consistency_loss(logits_a: Tensor, logits_b: Tensor) -> Tensor:
    """Symmetric agreement of two predictions (B, K, H, W) of the same images (e.g. clean and perturbed): each is
    trained towards the other's detached hard label (CE to its argmax; K = 1: BCE to ``logit > 0``). Returns the sum of
    the two terms, each a mean over pixels."""
    _check_same_shape("consistency_loss", logits_a=logits_a, logits_b=logits_b)
    if logits_a.ndim < 2:
        raise ValueError(f"consistency_loss: logits must be (B, K, ...), got shape {tuple(logits_a.shape)}")
    a = logits_a.float()
    b = logits_b.float()
    if a.shape[1] == 1:
        target_a = (a.detach() > 0).float()
        target_b = (b.detach() > 0).float()
        return F.binary_cross_entropy_with_logits(a, target_b) + F.binary_cross_entropy_with_logits(b, target_a)
    target_a = a.detach().argmax(dim=1)
    target_b = b.detach().argmax(dim=1)
    return F.cross_entropy(a, target_b) + F.cross_entropy(b, target_a)
