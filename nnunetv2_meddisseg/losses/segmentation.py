"""nnU-Net's Dice + CE segmentation loss of several outputs at once.

Stage II scores four logit maps (final logits, three decoding paths) against one target. Per map nnU-Net's
``DC_and_CE_loss`` issues about 65 operations (forward and backward); ``dice_ce_per_output`` computes the four values
from one stacked tensor in about a fifth of that (on a GPU each operation is at least one kernel launch). It restates
nnU-Net's code: ``training.nnunet_copies.PINNED`` pins the three methods' source, and
``tests/losses/test_segmentation.py`` compares values and gradients with nnU-Net's loss.
"""
from typing import Optional, Sequence

import torch
from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss
from nnunetv2.training.loss.robust_ce_loss import RobustCrossEntropyLoss
from nnunetv2.utilities.helpers import softmax_helper_dim1
from torch import Tensor

__all__ = ["dice_ce_settings", "dice_ce_per_output"]


def dice_ce_settings(loss: object) -> Optional[dict]:
    """The keyword arguments of ``dice_ce_per_output`` that reproduce ``loss``; None (call the loss itself) where it is
    no nnU-Net softmax Dice + plain CE ``DC_and_CE_loss`` (as ``nnUNetTrainer._build_loss`` makes it) or its batch Dice
    is gathered over processes."""
    if type(loss) is not DC_and_CE_loss:
        return None
    dc = getattr(loss.dc, "_orig_mod", loss.dc)
    ce = loss.ce
    if type(dc) is not MemoryEfficientSoftDiceLoss or dc.apply_nonlin is not softmax_helper_dim1:
        return None
    if (type(ce) is not RobustCrossEntropyLoss or ce.weight is not None or ce.label_smoothing != 0
            or ce.reduction != "mean"):
        return None
    if dc.batch_dice and dc.ddp:
        return None
    return dict(batch_dice=bool(dc.batch_dice), do_bg=bool(dc.do_bg), smooth=float(dc.smooth),
                weight_ce=float(loss.weight_ce), weight_dice=float(loss.weight_dice), ignore_label=loss.ignore_label)


def dice_ce_per_output(outputs: Sequence[Tensor], target: Tensor, batch_dice: bool, do_bg: bool = False,
                       smooth: float = 1e-5, weight_ce: float = 1.0, weight_dice: float = 1.0,
                       ignore_label: Optional[int] = None) -> Tensor:
    """nnU-Net's ``DC_and_CE_loss(MemoryEfficientSoftDiceLoss)`` of each output against one target.
    outputs: P logit maps, each (B, K, *spatial); target: (B, 1, *spatial) label map. Returns (P,) fp32: entry p is
    ``weight_ce * CE(outputs[p]) - weight_dice * Dice(outputs[p])`` as nnU-Net defines them: CE the mean over labelled
    pixels (0 when none is labelled), Dice the softmax's soft Dice per sample and class (``batch_dice``: summed over the
    batch), classes from 1 unless ``do_bg``, ``(2 I + smooth) / max(G + S + smooth, 1e-8)`` averaged. Pixels labelled
    ``ignore_label`` count in neither term."""
    if len(outputs) == 0:
        raise ValueError("dice_ce_per_output: no outputs given")
    logits = torch.stack(list(outputs))  # (P, B, K, *spatial)
    spatial = tuple(range(3, logits.ndim))
    labels = target.long()  # (B, 1, *spatial)
    mask = None if ignore_label is None else labels != ignore_label
    if mask is not None:
        labels = torch.where(mask, labels, 0)
    log_p = torch.log_softmax(logits, dim=2)
    with torch.no_grad():
        onehot = torch.zeros(logits.shape[1:], device=logits.device, dtype=torch.float32).scatter_(1, labels, 1)
        if mask is not None:
            onehot *= mask
        first = 0 if do_bg else 1
        onehot = onehot[:, first:]
        gt = onehot.sum(tuple(range(2, onehot.ndim)))  # (B, K')
        if batch_dice:
            gt = gt.sum(0)
    # cross-entropy: -log p of the labelled class, summed over labelled pixels / their number
    nll = -log_p.gather(2, labels.expand(logits.shape[0], *labels.shape))  # (P, B, 1, *spatial)
    if mask is None:
        ce = nll.mean(dim=(1, 2) + spatial)
    else:
        ce = (nll * mask).sum(dim=(1, 2) + spatial) / mask.sum().clamp_min(1)
    # soft Dice of the softmax (computed in fp32)
    p = log_p.float().exp()[:, :, first:]  # (P, B, K', *spatial)
    if mask is not None:
        p = p * mask
    intersect = (p * onehot).sum(spatial)  # (P, B, K')
    predicted = p.sum(spatial)
    if batch_dice:
        intersect, predicted = intersect.sum(1), predicted.sum(1)  # (P, K')
    dice = (2 * intersect + smooth) / (gt + predicted + smooth).clamp_min(1e-8)
    dice = dice.flatten(1).mean(1)  # (P,)
    return weight_ce * ce.float() - weight_dice * dice
