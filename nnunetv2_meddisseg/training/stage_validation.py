"""Validation of ``nnUNetTrainerMedDisSeg``'s current stage: the logits of the stage's model (Stage I: network +
head; Stage II: the network's final logits) for nnU-Net's online validation, and the final validation with the
full network."""
from typing import Optional

from torch import Tensor, nn

from nnunetv2_meddisseg.architectures import MedDisSegOutput
from nnunetv2_meddisseg.training.compilation import compiled_step
from nnunetv2_meddisseg.training.stage_losses import STAGE_1, stage1_logits

__all__ = ["StageValidation"]


class StageValidation:
    """Mixin of ``nnUNetTrainerMedDisSeg``: ``validation_step``, ``_validation_logits`` and
    ``perform_actual_validation``. Uses the trainer's ``network``, ``stage1_head``, ``training_stage``,
    ``_autocast``, ``_single_output`` and, where compiled, ``training.compilation.compiled_step``'s attributes."""

    def _validation_logits(self, data: Tensor, network: Optional[nn.Module] = None,
                           head: Optional[nn.Module] = None) -> Tensor:
        """Logits (B, K, H, W) of the current stage's model (Stage I: network + head) for data (B, C, H, W);
        ``network`` / ``head`` default to the trainer's (possibly wrapped) modules."""
        network = self.network if network is None else network
        if self.training_stage == STAGE_1:
            head = self.stage1_head if head is None else head
            return stage1_logits(head, network(data), data.shape[-2:])[0]
        output = network(data)
        return output.logits if isinstance(output, MedDisSegOutput) else output

    def validation_step(self, batch: dict) -> dict:
        """nnU-Net's ``validation_step`` on the current stage's model: while it runs, the ``self.network`` it
        calls returns that model's logits (B, K, H, W) (``_validation_logits``: Stage I network + head, Stage II
        the network's final logits), under ``_autocast`` (fp32 under bf16 autocast), and deep supervision
        is off (one full-resolution output, as ``_get_deep_supervision_scales`` gives one target), so
        nnU-Net's loss, pseudo Dice and ignore-label handling apply to them unchanged."""
        return compiled_step(self, "validation", self._validation_step, batch)

    def _validation_step(self, batch: dict) -> dict:
        network, head = self.network, self.stage1_head

        def stage_logits(data: Tensor) -> Tensor:
            with self._autocast():
                logits = self._validation_logits(data, network, head)
            return logits.float() if self.bf16 else logits

        self.network = stage_logits
        try:
            with self._single_output():
                return super().validation_step(batch)
        finally:
            self.network = network

    def perform_actual_validation(self, save_probabilities: bool = False) -> None:
        network = self._plain_network()
        encoder_only = network.encoder_only
        network.encoder_only = False
        if self.training_stage == STAGE_1:
            self.print_to_log_file("WARNING: validating a network that never reached Stage II (untrained decoder)")
        try:
            super().perform_actual_validation(save_probabilities)
        finally:
            network.encoder_only = encoder_only
