"""The package's environment variables, where nnU-Net finds our trainers, and nnU-Net's folder environment.

nnU-Net takes the first trainer of a requested name in the folders of ``nnUNet_extTrainer``; everything here puts
``TRAINER_FOLDER`` first. Imports nothing of the package and no torch: every module may import it, ``-h`` stays fast.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, MutableMapping, Optional, Sequence

__all__ = ["NNUNET_FOLDERS", "EXT_TRAINER_VARIABLE", "SEED_ENVIRONMENT_VARIABLE", "BF16_ENVIRONMENT_VARIABLE",
           "CPU_BF16_ENVIRONMENT_VARIABLE", "DATA_AUGMENTATION_PROCESSES_VARIABLE",
           "COMPILE_VARIABLE", "TRUE_VALUES", "flag_is_set", "bf16_training_requested", "TRAINER_FOLDER",
           "trainer_folder", "trainer_search_path", "set_nnunet_environment", "nnunet_environment",
           "planning_environment", "use_our_trainers", "trainer_output_folder"]

#: nnU-Net's data folders: raw datasets, preprocessed data and plans, trained models
NNUNET_FOLDERS = ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")
#: nnU-Net's list of folders (``os.pathsep``-separated) searched for trainers it does not ship
EXT_TRAINER_VARIABLE = "nnUNet_extTrainer"
#: nnU-Net's number of data augmentation processes (0: batches made in the training process)
DATA_AUGMENTATION_PROCESSES_VARIABLE = "nnUNet_n_proc_DA"
#: fixes the run seed of our trainers (an integer >= 0)
SEED_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_seed"
#: (a flag, :func:`flag_is_set`) our trainers train under bf16 autocast without a GradScaler
BF16_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_bf16"
#: (a flag, :func:`flag_is_set`) MedDisSegNet's inference forward on a CPU runs under bf16 autocast
CPU_BF16_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_cpu_bf16"
#: nnU-Net's switch for torch.compile (a flag; unset: nnU-Net's and our trainers' own decision)
COMPILE_VARIABLE = "nnUNet_compile"
#: the values (any case, surrounding blanks ignored) that turn a flag on
TRUE_VALUES = ("1", "true", "t", "yes", "y", "on")
#: the folder to put into ``nnUNet_extTrainer`` (``python -m nnunetv2_meddisseg.trainer_path`` prints it)
TRAINER_FOLDER = Path(__file__).resolve().parent / "nnunet_trainers"


def flag_is_set(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """True when the variable ``name`` of ``env`` (default ``os.environ``) is one of ``TRUE_VALUES``."""
    value = (os.environ if env is None else env).get(name, "")
    return value.strip().lower() in TRUE_VALUES


#: ``TRITON_INTERPRET``, read once at import as Triton reads it; the kernels' tensor checks read this, not os.environ
TRITON_INTERPRETED = flag_is_set("TRITON_INTERPRET")


def bf16_training_requested() -> bool:
    """Whether our trainers (and the plan command's memory measurement) train under bf16 autocast, no GradScaler."""
    return flag_is_set(BF16_ENVIRONMENT_VARIABLE)


def trainer_folder() -> str:
    """Absolute path of the folder to put into ``nnUNet_extTrainer``."""
    return str(TRAINER_FOLDER)


def trainer_search_path(extra_folders: Sequence[str] = (), current: Optional[str] = None) -> str:
    """The value for ``nnUNet_extTrainer``: ours, ``extra_folders``, then ``current``'s (default: this process's)."""
    if current is None:
        current = os.environ.get(EXT_TRAINER_VARIABLE, "")
    folders = [trainer_folder(), *map(str, extra_folders), *current.split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(f for f in folders if f.strip()))


def set_nnunet_environment(env: MutableMapping[str, str], root: Optional[Path] = None,
                           extra_trainer_folders: Sequence[str] = ()) -> MutableMapping[str, str]:
    """Set nnU-Net's environment in ``env`` (``os.environ`` or a subprocess's copy) and return it: with ``root``,
    ``NNUNET_FOLDERS`` as ``root/<name>`` (created); always ``nnUNet_extTrainer`` by ``trainer_search_path``."""
    if root is not None:
        for name in NNUNET_FOLDERS:
            folder = Path(root) / name
            folder.mkdir(parents=True, exist_ok=True)
            env[name] = str(folder)
    env[EXT_TRAINER_VARIABLE] = trainer_search_path(extra_trainer_folders, env.get(EXT_TRAINER_VARIABLE, ""))
    return env


def nnunet_environment(root: Path, trainer_folders: Sequence[str] = (),
                       base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``set_nnunet_environment`` on a copy of ``base`` (default ``os.environ``)."""
    return dict(set_nnunet_environment(dict(os.environ if base is None else base), root, trainer_folders))


def planning_environment(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` without ``nnUNet_n_proc_DA=0``, for ``nnUNetv2_plan_and_preprocess``: nnU-Net 2.8.1's planner calls
    ``torch.set_num_threads(nnUNet_n_proc_DA)``, which fails for 0 (training reads 0 as "no worker processes")."""
    return {k: v for k, v in env.items() if not (k == DATA_AUGMENTATION_PROCESSES_VARIABLE and v.strip() == "0")}


def use_our_trainers() -> None:
    """Put this package's trainer folder first in ``nnUNet_extTrainer`` of this process (other folders stay)."""
    set_nnunet_environment(os.environ)


def trainer_output_folder(dataset_name: str, trainer: str, plans: str, configuration: str,
                          results: Optional[str] = None) -> Path:
    """``<results>/<dataset>/<trainer>__<plans>__<configuration>``; ``results`` defaults to ``$nnUNet_results``."""
    if results is None:
        from nnunetv2.paths import nnUNet_results
        results = nnUNet_results.require()
    return Path(results) / dataset_name / f"{trainer}__{plans}__{configuration}"
