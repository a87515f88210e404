"""What nnU-Net's plans hold to build ``MedDisSegNet``, with the defaults ``nnUNetv2_meddisseg_plan`` writes."""
from typing import Optional

from nnunetv2_meddisseg.errors import UserError

__all__ = ["NETWORK_CLASS_NAME", "ADDED_NORMS", "DEFAULT_ADDED_NORM", "default_arch_kwargs", "architecture_entry"]

#: the ``network_class_name`` nnU-Net imports
NETWORK_CLASS_NAME = "nnunetv2_meddisseg.architectures.MedDisSegNet"

#: ``--added_norm``: the norm of the blocks Med-DisSeg adds to the encoder (``added_norm_op``); "batch" keeps the
#: plans' ``norm_op`` (the paper's BatchNorm everywhere), "instance" normalises each image by its own statistics
ADDED_NORMS = {
    "batch": (None, None),
    "instance": ("nnunetv2_meddisseg.blocks.norm.SingleKernelInstanceNorm2d", {"eps": 1e-5, "affine": True}),
}
#: ``nnUNetv2_meddisseg_plan``'s default (it scores higher on validation data: benchmarks/RESULTS.md)
DEFAULT_ADDED_NORM = "instance"


def default_arch_kwargs(encoder_weights: Optional[str] = None, elat: bool = True, activation: str = "telu",
                        decoder_fusion: str = "sum", cbat: bool = True,
                        added_norm: str = DEFAULT_ADDED_NORM) -> dict:
    """The ``arch_kwargs`` of a MedDisSeg plan; ``added_norm="batch"`` writes no ``added_norm_op`` entry."""
    if added_norm not in ADDED_NORMS:
        raise UserError(f"--added_norm must be one of {', '.join(ADDED_NORMS)}, got {added_norm!r}")
    kwargs = {
        "encoder_weights": encoder_weights,
        "elat": elat,
        "activation": activation,
        "decoder_fusion": decoder_fusion,
        "cbat": cbat,
        "conv_op": "torch.nn.modules.conv.Conv2d",
        "norm_op": "nnunetv2_meddisseg.blocks.norm.UncountedBatchNorm2d",
        "norm_op_kwargs": {"eps": 1e-5, "affine": True},
    }
    added_op, added_kwargs = ADDED_NORMS[added_norm]
    if added_op is not None:
        kwargs.update(added_norm_op=added_op, added_norm_op_kwargs=dict(added_kwargs))
    return kwargs


def architecture_entry(**arch_kwargs) -> dict:
    """The ``architecture`` block of a plans configuration; ``arch_kwargs`` go to ``default_arch_kwargs``."""
    kwargs = default_arch_kwargs(**arch_kwargs)
    return {
        "network_class_name": NETWORK_CLASS_NAME,
        "arch_kwargs": kwargs,
        "_kw_requires_import": [k for k in ("conv_op", "norm_op", "added_norm_op") if k in kwargs],
    }
