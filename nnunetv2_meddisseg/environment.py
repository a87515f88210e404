"""The environment variables the package reads or sets, one constant per name, and the one function that
sets nnU-Net's folders and ``nnUNet_extTrainer``.

nnU-Net reads three folders from the environment (:data:`NNUNET_FOLDERS`) and finds trainers it does not
ship in the folders of ``nnUNet_extTrainer``, taking the first class with the requested name. Everything
here that sets that variable puts this package's trainer folder first, then any other folders, each once
(:func:`trainer_search_path`). Imports no torch: the commands' ``-h`` stays fast.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping, Optional, Sequence

from nnunetv2_meddisseg.trainer_path import trainer_folder

__all__ = ["NNUNET_FOLDERS", "EXT_TRAINER_VARIABLE", "SEED_ENVIRONMENT_VARIABLE", "BF16_ENVIRONMENT_VARIABLE",
           "CPU_BF16_ENVIRONMENT_VARIABLE", "RECIPE_ENVIRONMENT_VARIABLE", "DATA_AUGMENTATION_PROCESSES_VARIABLE",
           "trainer_search_path", "set_nnunet_environment"]

#: nnU-Net's data folders: raw datasets, preprocessed data and plans, trained models
NNUNET_FOLDERS = ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")
#: nnU-Net's list of folders (``os.pathsep``-separated) searched for trainers it does not ship
EXT_TRAINER_VARIABLE = "nnUNet_extTrainer"
#: nnU-Net's number of data augmentation processes (0: batches made in the training process)
DATA_AUGMENTATION_PROCESSES_VARIABLE = "nnUNet_n_proc_DA"
#: fixes the run seed of our trainers (an integer >= 0)
SEED_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_seed"
#: ("1", "true" or "t") our trainers train under bf16 autocast without a GradScaler
BF16_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_bf16"
#: ("1", "true" or "t") MedDisSegNet's inference forward on a CPU runs under bf16 autocast
CPU_BF16_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_cpu_bf16"
#: names a JSON file of recipe overrides (``{"num_epochs": 20, ...}``) applied to every trainer's recipe
RECIPE_ENVIRONMENT_VARIABLE = "nnUNet_meddisseg_recipe"


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
