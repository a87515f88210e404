"""The package's environment: the variables it reads or sets (one constant per name, one parser for flags), where
nnU-Net finds our trainers, and nnU-Net's folder environment as our commands, the demo, the benchmarks and the tests
set it up.

nnU-Net reads three folders from the environment (:data:`NNUNET_FOLDERS`) and finds trainers it does not ship in
the folders of ``nnUNet_extTrainer``, taking the first class with the requested name. Everything here that sets
that variable puts this package's trainer folder (:data:`TRAINER_FOLDER`) first, then any other folders, each once
(:func:`trainer_search_path`). A trained model lives in :func:`trainer_output_folder`. Imports nothing of the
package and no torch: every module may import it, and the commands' ``-h`` stays fast.
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
    """True when the environment variable ``name`` (in ``env``, default ``os.environ``) is one of
    :data:`TRUE_VALUES`; the one reading of every on/off variable of the package."""
    value = (os.environ if env is None else env).get(name, "")
    return value.strip().lower() in TRUE_VALUES


#: Triton's interpreter is on (``TRITON_INTERPRET`` set before Triton is imported): read once, at import, as Triton
#: reads it; the kernels' checks of a tensor read this, not the environment
TRITON_INTERPRETED = flag_is_set("TRITON_INTERPRET")


def bf16_training_requested() -> bool:
    """True when :data:`BF16_ENVIRONMENT_VARIABLE` is set: our trainers (and the plan command's memory measurement)
    train under bf16 autocast without a GradScaler."""
    return flag_is_set(BF16_ENVIRONMENT_VARIABLE)


def trainer_folder() -> str:
    """Absolute path of the folder to put into ``nnUNet_extTrainer``."""
    return str(TRAINER_FOLDER)


def trainer_search_path(extra_folders: Sequence[str] = (), current: Optional[str] = None) -> str:
    """The value for ``nnUNet_extTrainer``: this package's trainer folder, then ``extra_folders``, then the
    folders of ``current`` (default: this process's ``nnUNet_extTrainer``), each once."""
    if current is None:
        current = os.environ.get(EXT_TRAINER_VARIABLE, "")
    folders = [trainer_folder(), *map(str, extra_folders), *current.split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(f for f in folders if f.strip()))


def set_nnunet_environment(env: MutableMapping[str, str], root: Optional[Path] = None,
                           extra_trainer_folders: Sequence[str] = ()) -> MutableMapping[str, str]:
    """Set nnU-Net's environment in ``env`` (``os.environ`` or a copy for a subprocess) and return it.

    With ``root``, the three folders :data:`NNUNET_FOLDERS` are ``root/<name>`` (created); always,
    ``nnUNet_extTrainer`` = :func:`trainer_search_path` of ``extra_trainer_folders`` and ``env``'s own value."""
    if root is not None:
        for name in NNUNET_FOLDERS:
            folder = Path(root) / name
            folder.mkdir(parents=True, exist_ok=True)
            env[name] = str(folder)
    env[EXT_TRAINER_VARIABLE] = trainer_search_path(extra_trainer_folders, env.get(EXT_TRAINER_VARIABLE, ""))
    return env


def nnunet_environment(root: Path, trainer_folders: Sequence[str] = (),
                       base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """A copy of ``base`` (default ``os.environ``) with the three nnU-Net folders in ``root`` (created)
    and ``nnUNet_extTrainer`` = this package's trainer folder, ``trainer_folders``, then ``base``'s own folders."""
    return dict(set_nnunet_environment(dict(os.environ if base is None else base), root, trainer_folders))


def planning_environment(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` for ``nnUNetv2_plan_and_preprocess``: without ``nnUNet_n_proc_DA=0``.

    nnU-Net 2.8.1's planner calls ``torch.set_num_threads(nnUNet_n_proc_DA)`` while it estimates the
    network's memory, which fails for 0; training reads the variable as "no worker processes", so
    only planning must do without it."""
    return {k: v for k, v in env.items() if not (k == DATA_AUGMENTATION_PROCESSES_VARIABLE and v.strip() == "0")}


def use_our_trainers() -> None:
    """Put this package's trainer folder first in ``nnUNet_extTrainer`` of this process (other folders stay)."""
    set_nnunet_environment(os.environ)


def trainer_output_folder(dataset_name: str, trainer: str, plans: str, configuration: str,
                          results: Optional[str] = None) -> Path:
    """``<results>/<dataset>/<trainer>__<plans>__<configuration>`` (nnU-Net's layout; ``results``
    defaults to ``$nnUNet_results``, an error naming the variable where it is unset)."""
    if results is None:
        from nnunetv2.paths import nnUNet_results
        results = nnUNet_results.require()
    return Path(results) / dataset_name / f"{trainer}__{plans}__{configuration}"
