"""Names and entries that users' files may carry besides the ones the package writes, and how they are read: the
one home of every reader of such files.

Each entry names the files that need it. The package writes none of them; an entry can go once no such file is
in use (a major version may drop them, saying so in its notes), together with the line that consults it.

- Plans files (``nnUNetPlans.json`` of ``nnUNetv2_meddisseg_plan``, ``plans.json`` beside a trained model) that
  name the normalisation classes by other names: :data:`NORM_CLASSES`, read by ``blocks/norm.py``.
- Checkpoints of ``nnUNetTrainerMedDisSeg`` without a ``meddisseg_stage`` entry: :func:`checkpoint_stage_without_entry`,
  read by ``training/stages.py``.
- Checkpoints that keep our per-epoch curves in an entry of their own (``training_curves``) instead of nnU-Net's
  ``logging``: :func:`curves_entry`, read by ``training/extended_trainer.py``.
- Checkpoints of ``nnUNetTrainerMedDisSeg`` that name Stage I's head group "decoder" (in the optimizer state and in
  the ``lr_decoder`` / ``grad_norm_decoder`` curves of Stage I epochs): :func:`head_group_named`,
  :func:`curves_with_the_head_named`, read by ``training/nnUNetTrainerMedDisSeg.py``.

Imports nothing of the package: every layer may read it.
"""
import math
from typing import List, Mapping, MutableMapping, Sequence

__all__ = ["NORM_CLASSES", "checkpoint_stage_without_entry", "curves_entry",
           "head_group_named", "curves_with_the_head_named"]

#: ``blocks.norm`` class names that plans files may store -> the class each names
NORM_CLASSES: Mapping[str, str] = {"BatchNorm2d": "UncountedBatchNorm2d",
                                   "InstanceNorm2d": "SingleKernelInstanceNorm2d"}

#: Stage I's head group: the name some checkpoints store, and the name the trainer writes
_HEAD_GROUP_BEFORE, _HEAD_GROUP = "decoder", "head"


def checkpoint_stage_without_entry(checkpoint: Mapping[str, object]) -> str:
    """The stage (its stored name, ``stage1`` / ``stage2``) of a checkpoint without a ``meddisseg_stage`` entry:
    Stage I where it holds the head (``stage1_head_weights``), else Stage II."""
    return "stage1" if "stage1_head_weights" in checkpoint else "stage2"


def curves_entry(checkpoint: Mapping[str, object]) -> Mapping[str, Sequence[float]]:
    """The curves a checkpoint keeps in its own ``training_curves`` entry (empty where it has none)."""
    return checkpoint.get("training_curves") or {}


def head_group_named(param_groups: Sequence[MutableMapping[str, object]], names: Sequence[str]) -> None:
    """Give restored optimizer groups the names of the groups they restore (``names``, in order): a Stage I
    optimizer state may call the head group "decoder"."""
    for group, name in zip(param_groups, names):
        if group.get("name") == _HEAD_GROUP_BEFORE and name == _HEAD_GROUP:
            group["name"] = name


def curves_with_the_head_named(curves: MutableMapping[str, List[float]]) -> None:
    """Move the Stage I epochs' values of ``lr_decoder`` / ``grad_norm_decoder`` (the head's group then) to
    ``lr_head`` / ``grad_norm_head``, in place; the ``stage`` curve says which epochs were Stage I."""
    stage1 = [epoch for epoch, stage in enumerate(curves.get("stage", [])) if stage == 1]
    for prefix in ("lr_", "grad_norm_"):
        before = curves.get(prefix + _HEAD_GROUP_BEFORE, [])
        moved = [epoch for epoch in stage1 if epoch < len(before) and not math.isnan(before[epoch])]
        if not moved:
            continue
        head = curves.setdefault(prefix + _HEAD_GROUP, [])
        head.extend([math.nan] * (len(before) - len(head)))
        for epoch in moved:
            head[epoch], before[epoch] = before[epoch], math.nan
