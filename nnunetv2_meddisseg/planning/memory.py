"""Training memory of Med-DisSeg on a CUDA GPU, measured, for the plan command's batch size.

``measure_training_memory`` runs Stage II training steps at two batch sizes in training's precision (fp16, or bf16
with ``nnUNet_meddisseg_bf16``); the two peaks give a line: a cost per sample plus a fixed cost (weights, gradients,
Adam's moments, workspaces). ``batch_size_for_memory`` picks the largest batch under a memory target.
"""
import math
from typing import NamedTuple, Optional, Sequence

from nnunetv2_meddisseg.environment import bf16_training_requested

__all__ = ["MemoryLine", "measure_training_memory", "estimated_memory_line", "batch_size_for_memory", "GIB",
           "TRAINING_BYTES_PER_PIXEL", "STATIC_TRAINING_BYTES"]

GIB = 1024 ** 3
# Stage II peak training memory per input pixel and sample: the slope of peak RSS from batch 1 to 4 at 256x256, fp32
# on CPU (benchmarks/train_step.py). Mixed precision on CUDA needs less, so budgets are conservative.
TRAINING_BYTES_PER_PIXEL = 22_000
# Parameters, gradients and two Adam moments of the 46.1 M parameter network, in bytes.
STATIC_TRAINING_BYTES = 4 * 4 * 46_115_000


class MemoryLine(NamedTuple):
    """Peak training memory = ``static_bytes + per_sample_bytes * batch`` on ``device``."""

    per_sample_bytes: float
    static_bytes: float
    device: str
    precision: str
    batches: Sequence[int]
    peaks_bytes: Sequence[int]

    def peak_bytes(self, batch: int) -> float:
        return self.static_bytes + self.per_sample_bytes * batch

    def describe(self) -> str:
        peaks = ", ".join(f"{p / GIB:.2f} GiB at batch {b}" for b, p in zip(self.batches, self.peaks_bytes))
        return f"measured on {self.device} ({self.precision} training step: {peaks})"


def estimated_memory_line(patch_size: Sequence[int]) -> MemoryLine:
    """Estimate without a GPU: ``TRAINING_BYTES_PER_PIXEL`` per pixel and sample on top of ``STATIC_TRAINING_BYTES``."""
    return MemoryLine(TRAINING_BYTES_PER_PIXEL * math.prod(patch_size), STATIC_TRAINING_BYTES, "estimate", "fp32",
                      (), ())


def batch_size_for_memory(line: MemoryLine, memory_target_gb: float, min_batch_size: int = 2,
                          max_batch_size: Optional[int] = None) -> int:
    """Largest batch with its peak within ``memory_target_gb`` GiB, clipped to ``[min_batch_size, max_batch_size]``."""
    batch = math.floor((memory_target_gb * GIB - line.static_bytes) / max(line.per_sample_bytes, 1.0))
    if max_batch_size is not None:
        batch = min(batch, max_batch_size)
    return int(max(batch, min_batch_size))


def measure_training_memory(patch_size: Sequence[int], architecture: dict, num_input_channels: int = 3,
                            num_classes: int = 2, batches: Sequence[int] = (2, 4), device: str = "cuda") -> MemoryLine:
    """Peak memory of two Stage II steps (the second holds Adam's moments) per batch in ``batches``, fitted to a
    line. ``architecture``: a plans configuration's ``architecture`` block. Needs a CUDA device."""
    import torch
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step
    from nnunetv2_meddisseg.training.objectives import recipe_stage2_loss
    from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe

    dev = torch.device(device)
    arch_kwargs = {**architecture["arch_kwargs"], "encoder_weights": None}  # the weights do not change the memory
    dtype = torch.bfloat16 if bf16_training_requested() else torch.float16
    loss_of = recipe_stage2_loss(MedDisSegRecipe())
    peaks = []
    for batch in batches:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        net = get_network_from_plans(architecture["network_class_name"], dict(arch_kwargs),
                                     architecture["_kw_requires_import"], num_input_channels, num_classes,
                                     allow_init=True).to(dev).train()
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=True)
        scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
        x = torch.randn(batch, num_input_channels, *patch_size, device=dev)
        target = (torch.rand(batch, 1, *patch_size, device=dev) > 0.5).float()
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype):
                loss = loss_of(net(x, output="all"), target)
            backward_clip_step(loss, optimizer, scaler, net.parameters())  # the trainer's update
        torch.cuda.synchronize(dev)
        peaks.append(int(torch.cuda.max_memory_allocated(dev)))
        del net, optimizer, x, target, loss
    torch.cuda.empty_cache()
    per_sample = (peaks[-1] - peaks[0]) / (batches[-1] - batches[0])
    return MemoryLine(per_sample, peaks[0] - per_sample * batches[0], torch.cuda.get_device_name(dev),
                      "bf16" if dtype == torch.bfloat16 else "fp16", tuple(batches), tuple(peaks))
