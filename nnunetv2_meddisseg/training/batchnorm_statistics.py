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

``BatchNormRecalibration`` is ``nnUNetTrainerMedDisSeg``'s use of it: before every validation, the running
statistics of the current stage's model are re-estimated over ``batchnorm_calibration_samples`` training
samples, the same batches every time, drawn as nnU-Net's dataloader draws them from a generator of their own.
"""
import math
from time import time
from typing import Callable, Dict, Iterable, List, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["batchnorm_layers", "recalibrate_batchnorm", "BatchNormRecalibration"]


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


class BatchNormRecalibration:
    """Mixin of ``nnUNetTrainerMedDisSeg``: re-estimation of the current stage's BatchNorm statistics before
    every validation (off where the recipe's ``batchnorm_calibration_samples`` is 0).

    Before every validation (nnU-Net's online validation at each epoch's end, so before every
    ``checkpoint_best.pth``, ``checkpoint_latest.pth`` and ``checkpoint_final.pth``) the running statistics
    of the current stage's model are re-estimated with its current weights over
    ``batchnorm_calibration_samples`` training samples: the same batches every time, drawn as nnU-Net's
    dataloader draws them (``batchnorm_calibration_augmentation``: through its training augmentation or
    not) from a generator of their own, so that no weight and no random number of training changes and
    ``--c`` re-estimates the same statistics. At the small batches of 2D plans the running averages of
    training trail the weights; nnU-Net validates and predicts with them.

    Uses the trainer's ``recipe``, ``run_seed``, ``batch_size``, ``device``, ``training_stage``,
    ``_plain_network`` / ``_plain_head``, ``_autocast``, ``_validation_logits`` and ``print_to_log_file``.
    """

    def _draw_batchnorm_calibration_batches(self) -> List[Tensor]:
        """``ceil(batchnorm_calibration_samples / batch_size)`` training batches (B, C, H, W) on the CPU,
        drawn as nnU-Net's training dataloader draws them (with or without its augmentation) from a
        generator seeded by the run seed alone: the same batches at every call, on every rank and after
        ``--c``, and no random number of the training stream is used."""
        from nnunetv2_meddisseg.training.nnunet_copies import training_dataloader
        from nnunetv2_meddisseg.training.seeding import preserved_random_state, seed_generators

        loader = training_dataloader(self, augmentation=self.recipe.batchnorm_calibration_augmentation)
        count = math.ceil(self.recipe.batchnorm_calibration_samples / self.batch_size)
        with preserved_random_state():
            seed_generators([self.run_seed, 2])
            return [loader.generate_train_batch()["data"] for _ in range(count)]

    def _recalibrate_batchnorm(self) -> None:
        """Re-estimate the running statistics of the current stage's model (network, and the head in Stage
        I) on the calibration batches, so that validation, ``checkpoint_best.pth``,
        ``checkpoint_final.pth`` and every prediction from them normalise with statistics of the weights
        they hold. Runs the unwrapped modules (no DDP buffer broadcast, no compiled code): each rank
        computes the same statistics from the same batches and weights."""
        from nnunetv2_meddisseg.training.compilation import eager_stance
        from nnunetv2_meddisseg.training.stage_losses import STAGE_1

        if self.recipe.batchnorm_calibration_samples <= 0 or self.training_stage is None:
            return
        start = time()
        if self._calibration_batches is None:
            self._calibration_batches = self._draw_batchnorm_calibration_batches()
        network, head = self._plain_network(), self._plain_head()
        modules = [network] if head is None or self.training_stage != STAGE_1 else [network, head]

        def forward(data: Tensor) -> None:
            with self._autocast():
                self._validation_logits(data.to(self.device, non_blocking=True), network, head)

        with eager_stance():  # a few forwards: not worth graphs of their own
            layers = recalibrate_batchnorm(modules, self._calibration_batches, forward)
        self.print_to_log_file(f"BatchNorm statistics of {layers} layers re-estimated over "
                               f"{len(self._calibration_batches) * self.batch_size} training samples "
                               f"({'with' if self.recipe.batchnorm_calibration_augmentation else 'without'} augmentation) "
                               f"in {time() - start:.1f} s")
