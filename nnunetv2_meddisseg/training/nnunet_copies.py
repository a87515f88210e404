"""Where our trainers copy nnU-Net code instead of calling it, and the pins of every restatement of nnU-Net's code.

Each copy restates part of an ``nnUNetTrainer`` method that offers no smaller hook: ``checkpoint_entries``
(``save_checkpoint``'s dict; ours adds entries and writes the file atomically), ``backward_clip_step`` (``train_step``'s
update; our steps clip every parameter the optimizer holds and read each group's gradient norm first),
``validation_counts``, ``training_dataloader`` and ``epoch_end``. ``nnUNetTrainerMedDisSeg.train_step`` copies the
whole ``train_step``, ``TrainerBase`` its autocast rule (fp16 autocast on CUDA only). Also pinned:
``losses.segmentation.dice_ce_per_output``, nnU-Net's Dice + CE.

``tests/training/test_nnunet_copies.py`` fails, naming the method, when a method in ``PINNED`` has another hash:
then compare the copies with the new source, update them and the hash. It also checks each copy against nnU-Net's.
"""
import hashlib
import inspect
import textwrap
from time import time
from typing import Callable, Dict, Iterable, Optional, Sequence, TypeVar

import numpy as np
import torch
from batchgenerators.utilities.file_and_folder_operations import join
from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.training.dataloading.nnunet_dataset import infer_dataset_class
from nnunetv2.training.loss.dice import get_tp_fp_fn_tn
from torch._dynamo import OptimizedModule

__all__ = ["PINNED", "source_hash", "checkpoint_entries", "backward_clip_step", "validation_counts",
           "training_dataloader", "epoch_end"]

T = TypeVar("T")

#: nnU-Net method (module:qualified name) -> sha256 of its ``inspect.getsource`` (dedented) in nnunetv2 2.8.1
PINNED: Dict[str, str] = {
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.save_checkpoint":
        "d8d53bc50b777f302923f352f5f2bf0d9fca14ab7bb9939ff687c2d28ff99a38",
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.train_step":
        "aac5fa9fda6d009a6721fb58b807f2b396e3e15ab05a35c23b066ca045b2cbb4",
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.validation_step":
        "bd84e8cca324f3556c81d140084a20c7d27af9de8c48c067188b5cf2539b9255",
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.get_dataloaders":
        "13b6ac3b86403e26d79498346e909884a7011153a7800ad63939bbec490091cf",
    # losses.segmentation.dice_ce_per_output
    "nnunetv2.training.loss.compound_losses:DC_and_CE_loss.forward":
        "377dddb0fc5c99f408bdf0c99bd72e3980cc6dfd563524df8c6151edf5742979",
    "nnunetv2.training.loss.dice:MemoryEfficientSoftDiceLoss.forward":
        "8bf439a8a5349f457001eb5422c10c25755c332b3c4414a3dfad3a533552b929",
    "nnunetv2.training.loss.robust_ce_loss:RobustCrossEntropyLoss.forward":
        "e240f96687735c61e2332f425a33ab9d4ecf6b060b97b8445816c0a85d30fe1e",
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.on_epoch_end":
        "cb9ff905a3a4d85b4965d2fe6856fa7e5089d3a6eb4c3655bde20fb0d93e9935",
}


def source_hash(method) -> str:
    """sha256 (hex) of the dedented source of ``method``."""
    return hashlib.sha256(textwrap.dedent(inspect.getsource(method)).encode("utf-8")).hexdigest()


def checkpoint_entries(trainer) -> dict:
    """The checkpoint dict ``nnUNetTrainer.save_checkpoint`` writes for ``trainer`` (copied; see ``PINNED``)."""
    if trainer.is_ddp:
        mod = trainer.network.module
    else:
        mod = trainer.network
    if isinstance(mod, OptimizedModule):
        mod = mod._orig_mod
    return {
        'network_weights': mod.state_dict(),
        'optimizer_state': trainer.optimizer.state_dict(),
        'grad_scaler_state': trainer.grad_scaler.state_dict() if trainer.grad_scaler is not None else None,
        'logging': trainer.logger.get_checkpoint(),
        '_best_ema': trainer._best_ema,
        'current_epoch': trainer.current_epoch + 1,
        'init_args': trainer.my_init_kwargs,
        'trainer_name': trainer.__class__.__name__,
        'inference_allowed_mirroring_axes': trainer.inference_allowed_mirroring_axes,
    }


def backward_clip_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, grad_scaler,
                       params: Iterable[torch.nn.Parameter],
                       before_clipping: Optional[Callable[[], T]] = None) -> Optional[T]:
    """``nnUNetTrainer.train_step``'s update (copied; see ``PINNED``), clipping ``params`` (nnU-Net: the network's)."""
    params = list(params)
    if grad_scaler is not None:
        grad_scaler.scale(loss).backward()
        grad_scaler.unscale_(optimizer)
        seen = before_clipping() if before_clipping is not None else None
        torch.nn.utils.clip_grad_norm_(params, 12)
        grad_scaler.step(optimizer)
        grad_scaler.update()
    else:
        loss.backward()
        seen = before_clipping() if before_clipping is not None else None
        torch.nn.utils.clip_grad_norm_(params, 12)
        optimizer.step()
    return seen


def validation_counts(label_manager, output: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> dict:
    """``nnUNetTrainer.validation_step`` from its loss on (copied; see ``PINNED``): ``loss`` and the pseudo Dice's tp /
    fp / fn per foreground class (or region) of logits ``output`` (B, K, ...) against ``target`` (B, 1, ...), which
    is changed in place where there is an ignore label, as in nnU-Net."""
    axes = [0] + list(range(2, output.ndim))
    if label_manager.has_regions:
        predicted_segmentation_onehot = (torch.sigmoid(output) > 0.5).long()
    else:
        output_seg = output.argmax(1)[:, None]
        predicted_segmentation_onehot = torch.zeros(output.shape, device=output.device, dtype=torch.float16)
        predicted_segmentation_onehot.scatter_(1, output_seg, 1)
        del output_seg
    if label_manager.has_ignore_label:
        if not label_manager.has_regions:
            mask = (target != label_manager.ignore_label).float()
            target[target == label_manager.ignore_label] = 0
        else:
            if target.dtype == torch.bool:
                mask = ~target[:, -1:]
            else:
                mask = 1 - target[:, -1:]
            target = target[:, :-1]
    else:
        mask = None
    tp, fp, fn, _ = get_tp_fp_fn_tn(predicted_segmentation_onehot, target, axes=axes, mask=mask)
    tp_hard = tp.detach().cpu().numpy()
    fp_hard = fp.detach().cpu().numpy()
    fn_hard = fn.detach().cpu().numpy()
    if not label_manager.has_regions:  # the background's counts are left out
        tp_hard = tp_hard[1:]
        fp_hard = fp_hard[1:]
        fn_hard = fn_hard[1:]
    return {'loss': loss.detach().cpu().numpy(), 'tp_hard': tp_hard, 'fp_hard': fp_hard, 'fn_hard': fn_hard}


def training_dataloader(trainer, augmentation: bool = True) -> nnUNetDataLoader:
    """The training ``nnUNetDataLoader`` of ``nnUNetTrainer.get_dataloaders`` (copied; see ``PINNED``), no augmenter:
    nnU-Net's training transforms, or without ``augmentation`` its validation transforms on plain patches.
    ``generate_train_batch()`` draws from the global random generators, as nnU-Net's does."""
    if trainer.dataset_class is None:
        trainer.dataset_class = infer_dataset_class(trainer.preprocessed_dataset_folder)
    patch_size = trainer.configuration_manager.patch_size
    deep_supervision_scales = trainer._get_deep_supervision_scales()
    labels = dict(is_cascaded=trainer.is_cascaded, foreground_labels=trainer.label_manager.foreground_labels,
                  regions=trainer.label_manager.foreground_regions if trainer.label_manager.has_regions else None,
                  ignore_label=trainer.label_manager.ignore_label)
    if augmentation:
        (
            rotation_for_DA,
            do_dummy_2d_data_aug,
            initial_patch_size,
            mirror_axes,
        ) = trainer.configure_rotation_dummyDA_mirroring_and_inital_patch_size()
        transforms = trainer.get_training_transforms(
            patch_size, rotation_for_DA, deep_supervision_scales, mirror_axes, do_dummy_2d_data_aug,
            use_mask_for_norm=trainer.configuration_manager.use_mask_for_norm, **labels)
    else:
        initial_patch_size = patch_size
        transforms = trainer.get_validation_transforms(deep_supervision_scales, **labels)
    dataset_tr, _ = trainer.get_tr_and_val_datasets()
    return nnUNetDataLoader(dataset_tr, trainer.batch_size,
                            initial_patch_size,
                            trainer.configuration_manager.patch_size,
                            trainer.label_manager,
                            oversample_foreground_percent=trainer.oversample_foreground_percent,
                            sampling_probabilities=None, pad_sides=None, transforms=transforms,
                            probabilistic_oversampling=trainer.probabilistic_oversampling)


def epoch_end(trainer, checkpoints: Sequence[str] = (), may_become_best: bool = True) -> None:
    """``nnUNetTrainer.on_epoch_end`` (copied; see ``PINNED``), writing each of ``checkpoints`` once after the periodic
    one, while ``current_epoch`` is still the finished epoch (recorded as in nnU-Net's own), and a new
    ``checkpoint_best.pth`` only where ``may_become_best`` (nnU-Net: always)."""
    trainer.logger.log('epoch_end_timestamps', time(), trainer.current_epoch)

    trainer.print_to_log_file('train_loss', np.round(trainer.logger.get_value('train_losses', step=-1), decimals=4))
    trainer.print_to_log_file('val_loss', np.round(trainer.logger.get_value('val_losses', step=-1), decimals=4))
    trainer.print_to_log_file('Pseudo dice', [np.round(i, decimals=4) for i in
                                              trainer.logger.get_value('dice_per_class_or_region', step=-1)])
    trainer.print_to_log_file(
        f"Epoch time: {np.round(trainer.logger.get_value('epoch_end_timestamps', step=-1) - trainer.logger.get_value('epoch_start_timestamps', step=-1), decimals=2)} s")  # noqa: E501

    # handling periodic checkpointing
    current_epoch = trainer.current_epoch
    written = []
    if (current_epoch + 1) % trainer.save_every == 0 and current_epoch != (trainer.num_epochs - 1):
        written.append('checkpoint_latest.pth')
    written += [name for name in checkpoints if name not in written]
    for name in written:
        trainer.save_checkpoint(join(trainer.output_folder, name))

    # handle 'best' checkpointing. ema_fg_dice is computed by the logger and can be accessed like this
    if may_become_best and (trainer._best_ema is None
                            or trainer.logger.get_value('ema_fg_dice', step=-1) > trainer._best_ema):
        trainer._best_ema = trainer.logger.get_value('ema_fg_dice', step=-1)
        trainer.print_to_log_file(f"Yayy! New best EMA pseudo Dice: {np.round(trainer._best_ema, decimals=4)}")
        trainer.save_checkpoint(join(trainer.output_folder, 'checkpoint_best.pth'))

    if trainer.local_rank == 0:
        trainer.logger.plot_progress_png(trainer.output_folder)

    trainer.current_epoch += 1
