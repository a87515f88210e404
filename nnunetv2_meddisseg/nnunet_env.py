"""nnU-Net's folder environment as our commands, the demo, the benchmarks and the tests set it up.

nnU-Net reads three folders from the environment (``nnUNet_raw``, ``nnUNet_preprocessed``,
``nnUNet_results``) and finds trainers it does not ship in the folders of ``nnUNet_extTrainer``
(this package's first: :func:`nnunetv2_meddisseg.environment.set_nnunet_environment`, the one function
that sets them). A trained model lives in :func:`trainer_output_folder`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from nnunetv2_meddisseg.environment import (DATA_AUGMENTATION_PROCESSES_VARIABLE, NNUNET_FOLDERS,
                                            set_nnunet_environment)

__all__ = ["NNUNET_FOLDERS", "nnunet_environment", "planning_environment", "use_our_trainers",
           "trainer_output_folder"]


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
