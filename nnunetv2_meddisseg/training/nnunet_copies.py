"""The one place where our trainers copy nnU-Net code instead of calling it.

nnU-Net's ``nnUNetTrainer.save_checkpoint`` builds its checkpoint dict and writes it in one method,
with no hook to add entries; ours must add its own (run seed, training stage, Stage I head, early
stopping) and write the file atomically. ``checkpoint_entries`` is that dict, copied from the method
named in ``PINNED``. ``tests/training/test_nnunet_copies.py`` hashes the installed nnU-Net's source of
every method in ``PINNED`` and fails, naming the method, when it differs from the source the copy was
taken from: then compare the copy with the new source, update it and the hash.
"""
import hashlib
import inspect
import textwrap
from typing import Dict

from torch._dynamo import OptimizedModule

__all__ = ["PINNED", "source_hash", "checkpoint_entries"]

#: nnU-Net method (module:qualified name) -> sha256 of its ``inspect.getsource`` (dedented) in nnunetv2 2.8.1
PINNED: Dict[str, str] = {
    "nnunetv2.training.nnUNetTrainer.nnUNetTrainer:nnUNetTrainer.save_checkpoint":
        "d8d53bc50b777f302923f352f5f2bf0d9fca14ab7bb9939ff687c2d28ff99a38",
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
