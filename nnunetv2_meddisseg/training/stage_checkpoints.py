"""What ``nnUNetTrainerMedDisSeg``'s checkpoints add to nnU-Net's: the training stage, and in Stage I the
head's weights; resuming (``--c``) puts the trainer into the recorded stage with that stage's optimizer groups
before nnU-Net restores its state."""
from typing import Dict, Mapping

from nnunetv2_meddisseg.training.input_errors import TrainingInputRuntimeError
from nnunetv2_meddisseg.training.stage_losses import STAGE_1, STAGE_2

__all__ = ["StageCheckpoints"]


class StageCheckpoints:
    """Mixin of ``nnUNetTrainerMedDisSeg``: its ``ExtendedTrainerBase`` checkpoint hooks (``_checkpoint_extras``,
    ``_before_restoring_checkpoint``, ``_restore_checkpoint_extras``)."""

    def _checkpoint_extras(self) -> Dict[str, object]:
        extras: Dict[str, object] = {"meddisseg_stage": self.training_stage}
        if self.training_stage == STAGE_1 and self.stage1_head is not None:
            extras["stage1_head_weights"] = self._plain_head().state_dict()
        return extras

    def _before_restoring_checkpoint(self, checkpoint: Mapping[str, object]) -> None:
        stage = checkpoint.get("meddisseg_stage")
        if stage is None:  # not written by this trainer: a Stage I checkpoint always holds the head
            stage = STAGE_1 if "stage1_head_weights" in checkpoint else STAGE_2
        if stage not in (STAGE_1, STAGE_2):
            raise TrainingInputRuntimeError(f"it records an unknown Med-DisSeg stage {stage!r} (expected {STAGE_1!r} "
                                            f"or {STAGE_2!r}): not a checkpoint of this trainer")
        if stage == STAGE_1 and "stage1_head_weights" not in checkpoint:
            raise TrainingInputRuntimeError("a Stage I checkpoint without 'stage1_head_weights' cannot be resumed: "
                                            "not a checkpoint of this trainer")
        if stage != self.training_stage or (stage == STAGE_1 and self.stage1_head is None):
            self.optimizer, self.lr_scheduler = self.configure_optimizers(stage)

    def _restore_checkpoint_extras(self, checkpoint: Mapping[str, object]) -> None:
        if self.training_stage == STAGE_1:
            self._plain_head().load_state_dict(checkpoint["stage1_head_weights"])
