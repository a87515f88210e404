"""Re-estimating BatchNorm's running statistics for a network's current weights ("precise BatchNorm").

BatchNorm evaluates (nnU-Net's validation and prediction) with running averages (momentum 0.1) of its training
batches' statistics. At nnU-Net's small batches (2-8 images; a 4x4 map per channel at H/16 for 64x64 inputs) those
are noisy, and the averages trail the weights. ``recalibrate_batchnorm`` replaces them by the plain average over
calibration batches run through the current weights (Wu and Johnson, *Rethinking "Batch" in BatchNorm*, 2021).

Layers are reset with ``momentum = None`` (a cumulative average) and the batches forwarded in training mode without
gradients; layers the forward never reached (e.g. the decoder in an encoder-only Stage I forward) get their old
statistics back. With equal batch sizes the running mean is exact; the running variance is the mean of per-batch
unbiased variances (PyTorch's rule), which differs from the pooled variance by the between-batch spread of the means.
``nnUNetTrainerMedDisSeg`` recalibrates before every validation on the same ``batchnorm_calibration_samples``
training samples every time, drawn as nnU-Net's dataloader draws, from a generator of their own.
"""
from typing import Callable, Iterable, List, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["batchnorm_layers", "recalibrate_batchnorm"]


def batchnorm_layers(modules: Sequence[nn.Module]) -> List[_BatchNorm]:
    """Every BatchNorm layer (1d/2d/3d, SyncBatchNorm) with running statistics in ``modules``, each once."""
    return list(dict.fromkeys(m for module in modules for m in module.modules()
                              if isinstance(m, _BatchNorm) and m.track_running_stats))


def recalibrate_batchnorm(modules: Sequence[nn.Module], batches: Iterable[Tensor],
                          forward: Callable[[Tensor], object]) -> int:
    """Replace the running statistics of the BatchNorm layers in ``modules`` by their average over ``batches``.
    batches: inputs (B, C, *spatial), B >= 2 where a layer normalises a 1x1 map. forward: runs one batch through
    ``modules`` (result discarded), in training mode under ``torch.no_grad()``. Returns the number of layers
    re-estimated (those the forward reached); ``ValueError`` where ``batches`` is empty but there are layers."""
    layers = batchnorm_layers(modules)
    if not layers:
        return 0
    modes = {id(m): (m, m.training) for module in modules for m in module.modules()}
    saved = [(layer.momentum, layer.running_mean.clone(), layer.running_var.clone(),
              layer.num_batches_tracked.clone()) for layer in layers]
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
        for layer, (momentum, mean, var, tracked) in zip(layers, saved):
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
