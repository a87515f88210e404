"""Checks of the converters' options and of nnU-Net's folder variables."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from .errors import OptionError

__all__ = ["validate_resize", "validate_dataset_id", "validate_mask_threshold", "require_env_folder",
           "optional_env_folder"]

_ENV_HINT = "see nnU-Net's documentation/setting_up_paths.md"


#: the smallest ``--resize``: a network down-samples its input 16x (Med-DisSeg's encoder; nnU-Net's 2D U-Nets more)
MIN_RESIZE = 16


def validate_resize(resize: Optional[int]) -> None:
    """``None`` (keep the original size) or at least ``MIN_RESIZE`` pixels."""
    if resize is None:
        return
    if isinstance(resize, bool) or not isinstance(resize, (int, np.integer)) or resize <= 0:
        raise OptionError(f"--resize must be a positive number of pixels (N gives NxN), got {resize!r}")
    if resize < MIN_RESIZE:
        raise OptionError(f"--resize must be at least {MIN_RESIZE} pixels (N gives NxN; the networks down-sample "
                          f"{MIN_RESIZE}x; the paper uses 256), got {resize}")


def validate_dataset_id(dataset_id: int) -> None:
    """nnU-Net dataset IDs are integers 1..999 (written with three digits)."""
    if isinstance(dataset_id, bool) or not isinstance(dataset_id, (int, np.integer)) or not 1 <= dataset_id <= 999:
        raise OptionError(f"-d must be a dataset ID between 1 and 999, got {dataset_id!r}")


def require_env_folder(env_var: str) -> Path:
    """The folder named by an nnU-Net environment variable (created if missing)."""
    value = os.environ.get(env_var)
    if not value:
        raise OptionError(f"environment variable {env_var} is not set: point it to nnU-Net's "
                          f"{env_var[7:]} data folder ({_ENV_HINT})")
    folder = Path(value)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OptionError(f"{env_var}={value} cannot be used as a folder: {err.strerror or err}") from None
    return folder


def optional_env_folder(env_var: str) -> Optional[Path]:
    value = os.environ.get(env_var)
    return Path(value) if value else None


def validate_mask_threshold(threshold: Optional[float]) -> None:
    """``None`` (the mask rule decides) or a finite number in [0, 65535): foreground is every mask value above it."""
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)) \
            or not np.isfinite(threshold) or not 0 <= threshold < 65535:
        raise OptionError(f"--mask_threshold must be a number from 0 to below 65535 (foreground: the mask values "
                          f"above it, e.g. 127 for 8-bit masks), got {threshold!r}")
