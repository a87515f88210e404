"""What nnU-Net's plans hold to build ``MedDisSegNet``: the ``architecture`` block of a plans configuration
(class name, ``arch_kwargs``, the entries nnU-Net imports) with the defaults that ``nnUNetv2_meddisseg_plan``
writes, the trainer builds on nnU-Net's own plans and the ablations' plans copies change one option of.
"""
from typing import Optional

from nnunetv2_meddisseg.errors import UserError

__all__ = ["NETWORK_CLASS_NAME", "ADDED_NORMS", "DEFAULT_ADDED_NORM", "default_arch_kwargs", "architecture_entry"]

#: the ``network_class_name`` nnU-Net imports
NETWORK_CLASS_NAME = "nnunetv2_meddisseg.architectures.MedDisSegNet"

#: ``--added_norm`` choices: the normalisation of the blocks Med-DisSeg adds to the encoder
#: (``MedDisSegNet``'s ``added_norm_op`` / ``added_norm_op_kwargs``); "batch" keeps the plans' ``norm_op``
#: (the paper's BatchNorm everywhere), "instance" normalises each image by its own statistics
ADDED_NORMS = {
    "batch": (None, None),
    "instance": ("nnunetv2_meddisseg.blocks.norm.SingleKernelInstanceNorm2d", {"eps": 1e-5, "affine": True}),
}
#: what ``nnUNetv2_meddisseg_plan`` writes without ``--added_norm`` (it scores higher on validation data:
#: benchmarks/RESULTS.md)
DEFAULT_ADDED_NORM = "instance"


def default_arch_kwargs(encoder_weights: Optional[str] = None, elat: bool = True, activation: str = "telu",
                        decoder_fusion: str = "sum", cbat: bool = True,
                        added_norm: str = DEFAULT_ADDED_NORM) -> dict:
    """The ``arch_kwargs`` block of a MedDisSeg plan (what ``MedDisSegNet`` receives from nnU-Net).
    ``added_norm``: a key of :data:`ADDED_NORMS`; "batch" (the paper's BatchNorm everywhere) writes no
    ``added_norm_op`` entry."""
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
    """The ``architecture`` block of a plans configuration running MedDisSegNet: class name, the
    ``arch_kwargs`` of :func:`default_arch_kwargs` (``arch_kwargs`` override its arguments) and the
    entries nnU-Net must import."""
    kwargs = default_arch_kwargs(**arch_kwargs)
    return {
        "network_class_name": NETWORK_CLASS_NAME,
        "arch_kwargs": kwargs,
        "_kw_requires_import": [k for k in ("conv_op", "norm_op", "added_norm_op") if k in kwargs],
    }
