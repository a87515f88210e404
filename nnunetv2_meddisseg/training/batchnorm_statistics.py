"""Re-estimating BatchNorm's running statistics for the weights a network has now ("precise BatchNorm").

In training, a BatchNorm layer normalises with the statistics of the batch in hand and keeps running
averages (momentum 0.1) of them; in evaluation, which is what nnU-Net predicts and validates with, it
normalises with those running averages. At the small batches nnU-Net plans (2-8 images, a 4x4 map per
channel at H/16 for 64x64 inputs) the batch statistics are noisy and the running averages trail the
weights: they mix statistics of networks from many earlier steps. ``recalibrate_batchnorm`` replaces
them by the plain average over calibration batches run through the current weights (Wu and Johnson,
*Rethinking "Batch" in BatchNorm*, 2021). It changes no weight, only the running mean and variance.

``recalibrate_batchnorm`` re-estimates the layers that the given forward runs: every BatchNorm layer
with ``track_running_stats`` in ``modules`` is reset (``momentum = None``: a cumulative average over
the batches), the batches are forwarded in training mode without gradients, and layers that the
forward never reached (e.g. the decoder of an encoder-only Stage I forward) get their previous
statistics back. Modes and momenta are restored afterwards.

The running mean is then the exact mean over the calibration batches when they have equal sizes; the
running variance is the mean of the per-batch unbiased variances (PyTorch's rule), which differs from
the pooled variance by the between-batch spread of the means.

``nnUNetTrainerMedDisSeg`` uses it before every validation: the running statistics of the current stage's model
are re-estimated over ``batchnorm_calibration_samples`` training samples, the same batches every time, drawn as
nnU-Net's dataloader draws them from a generator of their own.
"""
from typing import Callable, Dict, Iterable, List, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["batchnorm_layers", "recalibrate_batchnorm"]


def batchnorm_layers(modules: Sequence[nn.Module]) -> List[_BatchNorm]:
    """Every BatchNorm layer (1d/2d/3d, SyncBatchNorm) with running statistics in ``modules``, each once."""
    layers: Dict[int, _BatchNorm] = {}
    for module in modules:
        for m in module.modules():
            if isinstance(m, _BatchNorm) and m.track_running_stats:
                layers.setdefault(id(m), m)
    return list(layers.values())


def recalibrate_batchnorm(modules: Sequence[nn.Module], batches: Iterable[Tensor],
                          forward: Callable[[Tensor], object]) -> int:
    """Replace the running statistics of the BatchNorm layers in ``modules`` by their average over ``batches``.

    Args:
        modules: the modules whose BatchNorm layers are re-estimated (e.g. the network and a head).
        batches: input tensors, each (B, C, *spatial), B >= 2 where a layer normalises a 1x1 map.
        forward: runs one batch through ``modules`` (its result is discarded); called in training mode
            under ``torch.no_grad()``.

    Returns the number of layers re-estimated (those the forward reached). Raises ``ValueError`` when
    ``batches`` is empty while ``modules`` hold BatchNorm layers.
    """
    layers = batchnorm_layers(modules)
    if not layers:
        return 0
    modes = {id(m): (m, m.training) for module in modules for m in module.modules()}
    saved = {id(layer): (layer.momentum, layer.running_mean.clone(), layer.running_var.clone(),
                         layer.num_batches_tracked.clone()) for layer in layers}
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None
    count, reached = 0, 0
    try:
        for module in modules:
            module.train()
        with torch.no_grad():
            for batch in batches:
                forward(batch)
                count += 1
    finally:
        for m, training in modes.values():
            m.training = training
        for layer in layers:
            momentum, mean, var, tracked = saved[id(layer)]
            layer.momentum = momentum
            if count > 0 and int(layer.num_batches_tracked) > 0:
                reached += 1
            else:  # not reached by the forward: keep what it had
                layer.running_mean.copy_(mean)
                layer.running_var.copy_(var)
                layer.num_batches_tracked.copy_(tracked)
    if count == 0:
        raise ValueError("recalibrate_batchnorm: no calibration batches were given")
    return reached
