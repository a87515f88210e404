"""Med-DisSeg on the paper's own training schedule instead of nnU-Net's: Adam, a cosine schedule from 1e-4, 300
epochs of one pass over the training set, early stopping with patience 100, random flips and rotations only
(nnU-Net: 1000 epochs of 250 iterations, a polynomial schedule, full augmentation)."""
import math
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from batchgeneratorsv2.helpers.scalar_type import RandomScalar
from batchgeneratorsv2.transforms.base.basic_transform import BasicTransform
from batchgeneratorsv2.transforms.spatial.mirroring import MirrorTransform
from batchgeneratorsv2.transforms.spatial.spatial import SpatialTransform
from batchgeneratorsv2.transforms.utils.compose import ComposeTransforms
from batchgeneratorsv2.transforms.utils.deep_supervision_downsampling import DownsampleSegForDSTransform
from batchgeneratorsv2.transforms.utils.remove_label import RemoveLabelTansform
from nnunetv2.training.data_augmentation.compute_initial_patch_size import get_patch_size

from nnunetv2_meddisseg.training.lr_schedule import PerGroupCosineLRScheduler
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.recipe import PaperScheduleRecipe
from nnunetv2_meddisseg.training.stages import Stage

__all__ = ["nnUNetTrainerMedDisSeg_paper", "EarlyStopping", "iterations_per_epoch"]


def iterations_per_epoch(num_cases: int, batch_size: int) -> int:
    """Batches in one pass over ``num_cases`` cases: ``ceil(num_cases / batch_size)`` (at least 1)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return max(1, math.ceil(num_cases / batch_size))


class EarlyStopping:
    """Stop once the score has not improved for ``patience`` epochs (``update`` returns True); ``reset`` forgets
    the best (a new stage)."""

    def __init__(self, patience: int) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience = int(patience)
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None

    def reset(self) -> None:
        self.best, self.best_epoch = None, None

    def update(self, epoch: int, score: float) -> bool:
        if self.best is None or score > self.best:
            self.best, self.best_epoch = float(score), int(epoch)
        return epoch - self.best_epoch >= self.patience

    def state_dict(self) -> Dict[str, object]:
        return {"patience": self.patience, "best": self.best, "best_epoch": self.best_epoch}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.patience = int(state["patience"])
        self.best = None if state["best"] is None else float(state["best"])
        self.best_epoch = None if state["best_epoch"] is None else int(state["best_epoch"])


class _EarlyStop(Exception):
    """Raised by a hook of ``nnUNetTrainerMedDisSeg_paper`` to end nnU-Net's training loop early."""


class nnUNetTrainerMedDisSeg_paper(nnUNetTrainerMedDisSeg):
    """The paper's schedule (module docstring): a cosine per stage from each group's base rate, early stopping on the
    Stage II EMA pseudo Dice, rotations in nnU-Net's 2d range. Batch size from the plans; Stage I is the first
    quarter; epochs, patience and ``rotation_probability`` come from ``recipe.PaperScheduleRecipe``."""

    recipe: PaperScheduleRecipe = PaperScheduleRecipe()

    def __init__(self, plans: dict, configuration: str, fold: int, dataset_json: dict,
                 device: torch.device = torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.early_stopping = EarlyStopping(self.recipe.early_stopping_patience)

    def do_split(self):
        """nnU-Net's split; an epoch is then one pass over the training (validation) cases."""
        tr_keys, val_keys = super().do_split()
        self.num_iterations_per_epoch = iterations_per_epoch(len(tr_keys), self.batch_size)
        self.num_val_iterations_per_epoch = iterations_per_epoch(len(val_keys), self.batch_size)
        return tr_keys, val_keys

    def _lr_scheduler(self, optimizer: torch.optim.Optimizer, stage: Stage):
        """Each group's rate follows a cosine over the stage's epochs from its own base rate."""
        return PerGroupCosineLRScheduler(optimizer, [g["lr"] for g in optimizer.param_groups], stage.first_epoch,
                                         max(stage.num_epochs, 1))

    def configure_rotation_dummyDA_mirroring_and_inital_patch_size(self):
        """nnU-Net's 2d rotation range and mirror axes; the initial patch leaves room for rotation only."""
        rotation_for_DA, _, _, mirror_axes = super().configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        patch_size = self.configuration_manager.patch_size
        initial_patch_size = get_patch_size(patch_size, rotation_for_DA, rotation_for_DA, rotation_for_DA, (1.0, 1.0))
        return rotation_for_DA, False, initial_patch_size, mirror_axes

    def get_training_transforms(
            self,
            patch_size: Union[np.ndarray, Tuple[int]],
            rotation_for_DA: RandomScalar,
            deep_supervision_scales: Union[List, Tuple, None],
            mirror_axes: Tuple[int, ...],
            do_dummy_2d_data_aug: bool,
            use_mask_for_norm: List[bool] = None,
            is_cascaded: bool = False,
            foreground_labels: Union[Tuple[int, ...], List[int]] = None,
            regions: List[Union[List[int], Tuple[int, ...], int]] = None,
            ignore_label: int = None,
    ) -> BasicTransform:
        """Random rotation (``rotation_probability``, cropped to the patch) and flips along ``mirror_axes`` only.
        Not static as nnU-Net's is, so that the instance's recipe (overrides included) counts."""
        transforms: List[BasicTransform] = [SpatialTransform(
            patch_size, patch_center_dist_from_border=0, random_crop=False, p_elastic_deform=0,
            p_rotation=self.recipe.rotation_probability, rotation=rotation_for_DA,
            p_scaling=0, scaling=(1.0, 1.0), p_synchronize_scaling_across_axes=1, bg_style_seg_sampling=False,
            border_mode_seg="constant", padding_value_seg=-1)]
        if mirror_axes is not None and len(mirror_axes) > 0:
            transforms.append(MirrorTransform(allowed_axes=mirror_axes))
        transforms.append(RemoveLabelTansform(-1, 0))
        if deep_supervision_scales is not None:
            transforms.append(DownsampleSegForDSTransform(ds_scales=deep_supervision_scales))
        return ComposeTransforms(transforms)

    def on_train_start(self) -> None:
        """nnU-Net's; a resumed run that had already met the early-stopping criterion ends here, before any epoch."""
        super().on_train_start()
        stopper = self.early_stopping
        if stopper.best_epoch is not None and self.current_epoch - 1 - stopper.best_epoch >= stopper.patience:
            self.print_to_log_file(f"early stopping was met before epoch {self.current_epoch}: nothing to train")
            raise _EarlyStop

    def on_epoch_end(self) -> None:
        """nnU-Net's, then early stopping on the EMA pseudo Dice of the epochs that may become
        ``checkpoint_best.pth`` (Stage II); when it fires, the run ends after this epoch."""
        epoch, first = self.current_epoch, self.best_checkpoint_from
        super().on_epoch_end()
        if first is None or epoch < first:
            return
        if epoch == first:
            self.early_stopping.reset()  # the EMA restarts there
        if self.early_stopping.update(epoch, self.logger.get_value("ema_fg_dice", step=-1)):
            self.print_to_log_file(f"early stopping: no new best EMA pseudo Dice for {self.early_stopping.patience} "
                                   f"epochs (best {self.early_stopping.best:.4f} at epoch "
                                   f"{self.early_stopping.best_epoch})")
            raise _EarlyStop

    def run_training(self) -> None:
        """nnU-Net's; a hook's ``_EarlyStop`` ends it as nnU-Net's loop ends (``on_train_end``, ``checkpoint_final.pth``
        of the last finished epoch). Lowering ``num_epochs`` would not do: the loop reads it once, and the stage
        lengths and schedules derive from it."""
        try:
            super().run_training()
        except _EarlyStop:
            self.on_train_end()

    def _checkpoint_extras(self) -> Dict[str, object]:
        return {**super()._checkpoint_extras(), "early_stopping": self.early_stopping.state_dict()}

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        super()._restore_checkpoint_extras(checkpoint)
        if "early_stopping" in checkpoint:
            self.early_stopping.load_state_dict(checkpoint["early_stopping"])
