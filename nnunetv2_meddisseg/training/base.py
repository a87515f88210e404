"""The names the trainers' shared pieces have been imported by, re-exported from the modules that hold them:
``seeding`` (run seed, per-epoch seeding), ``checkpoints`` (atomic writing, reading for resuming),
``input_checks`` (NaN / inf checks of a batch), ``seeded_trainer`` (``SeededTrainer``) and
``extended_trainer`` (``ExtendedTrainerBase``, ``unwrap_module``, bf16 and curve settings)."""
from nnunetv2_meddisseg.environment import BF16_ENVIRONMENT_VARIABLE, SEED_ENVIRONMENT_VARIABLE
from nnunetv2_meddisseg.training.checkpoints import _read_checkpoint_for_resuming, atomic_torch_save
from nnunetv2_meddisseg.training.extended_trainer import (CURVE_PREFIXES, ExtendedTrainerBase, bf16_training_requested,
                                                          unwrap_module)
from nnunetv2_meddisseg.training.input_checks import check_finite_input, finite_per_sample, non_finite_input_message
from nnunetv2_meddisseg.training.seeded_trainer import SeededTrainer
from nnunetv2_meddisseg.training.seeding import (preserved_random_state, run_seed_from_environment, seed_epoch,
                                                 seed_generators)

__all__ = ["atomic_torch_save", "check_finite_input", "finite_per_sample", "non_finite_input_message",
           "unwrap_module", "run_seed_from_environment", "seed_epoch", "seed_generators", "preserved_random_state",
           "CURVE_PREFIXES", "SEED_ENVIRONMENT_VARIABLE", "BF16_ENVIRONMENT_VARIABLE", "bf16_training_requested",
           "SeededTrainer", "ExtendedTrainerBase"]
