"""nnUNetTrainerDispersive: nnU-Net's own network and training plus a dispersive loss (any network, 2D or 3D)."""
from functools import partial
from typing import List

from torch import Tensor, nn

from nnunetv2_meddisseg.training.errors import TrainingInputRuntimeError
from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step
from nnunetv2_meddisseg.training.recipe import DispersiveRecipe
from nnunetv2_meddisseg.training.step_report import group_gradient_norms, step_report
from nnunetv2_meddisseg.training.trainer_base import TrainerBase

__all__ = ["nnUNetTrainerDispersive"]


class nnUNetTrainerDispersive(TrainerBase):
    """nnU-Net's own network and training with a dispersive loss on its first encoder stage.

    A forward hook on ``network.encoder.stages[0]`` (behind the DDP / torch.compile wrappers) captures its training
    output; ``lambda_dispersive * dispersive.of(output)`` is added to nnU-Net's loss, and nothing else changes. With
    torch.compile the hook runs inside the graph (set ``nnUNet_compile=f`` if a torch version cannot trace it).

    ``lambda_dispersive`` = 0.2: nnU-Net trains a random network in one stage, as Med-DisSeg's Stage I, where the
    paper found 0.2 best (larger weights over-constrain early optimisation). ``infonce_cosine_centred``, not the
    paper's ``infonce_l2``: on raw features InfoNCE-L2 is lowered by inflating their scale (norm layers' affine weights
    grow freely) without spreading their directions, the uncentred cosine of the mostly non-negative (LeakyReLU)
    output by shrinking it; the centred cosine by neither. Chosen over the uncentred cosine on Kvasir-SEG validation
    data (``benchmarks/RESULTS.md``). It needs 3 samples (two centred ones are opposites), so nnU-Net's 3D batch of 2
    is not regularised (the log says so); under DDP every process's batch counts (``dispersive_gather``).
    """

    recipe: DispersiveRecipe = DispersiveRecipe()

    def _regularised_module(self) -> nn.Module:
        network = self._plain_network()
        stages = getattr(getattr(network, "encoder", None), "stages", None)
        if stages is None or len(stages) == 0:
            raise TrainingInputRuntimeError(f"{self.__class__.__name__} needs a network with encoder.stages (nnU-Net's "
                                            f"PlainConvUNet / ResidualEncoderUNet), got {network.__class__.__name__}")
        return stages[0]

    def _capture(self, module: nn.Module, inputs, output: Tensor) -> None:
        if module.training:
            self._captured.append(output)

    def _set_up_training(self) -> None:
        self._captured: List[Tensor] = []
        self._regularised_module().register_forward_hook(self._capture)
        # what train_step clips (every parameter the optimizer holds) and reads before clipping
        self._clipped = [p for group in self.optimizer.param_groups for p in group["params"]]
        self._gradient_norms = partial(group_gradient_norms, self.optimizer)

    def train_step(self, batch: dict) -> dict:
        """nnU-Net's step plus the dispersive term; returns the ``step_report`` (loss, terms, gradient norm, input
        check) and, on the epoch's first step, the dispersion diagnostics."""
        data, target, check = self._batch_to_device(batch)
        self.optimizer.zero_grad(set_to_none=True)
        self._captured.clear()
        with self.autocast:
            output = self.network(data)
            seg = self.loss(output, target)
            if len(self._captured) != 1:
                raise RuntimeError(f"expected one output of encoder.stages[0] per forward, got {len(self._captured)}")
            features = self._captured.pop()
            dispersive = self.dispersive.of(features)
            total = seg + self.recipe.lambda_dispersive * dispersive
        norms = backward_clip_step(total, self.optimizer, self.grad_scaler, self._clipped, self._gradient_norms)
        report = step_report(total, {"loss_seg": seg, "loss_dispersive": dispersive, **norms}, check)
        report.update(self._diagnostics(features))
        return report

    def validation_step(self, batch: dict) -> dict:
        """nnU-Net's ``validation_step``, after checking ``batch['data']`` for NaN / inf (naming the cases)."""
        self._check_validation_batch(batch)
        return super().validation_step(batch)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.logger.log("lr_network", self.optimizer.param_groups[0]["lr"], self.current_epoch)
