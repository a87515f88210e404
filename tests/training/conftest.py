"""The trainer tests' nnU-Net folders: a preprocessed folder for the tiny plans' dataset (``test_trainer_meddisseg``
builds its trainers from them; nothing is ever read from it) and a results folder, in the test's ``tmp_path``."""
from pathlib import Path

import pytest
import torch

#: the dataset of ``test_trainer_meddisseg.tiny_plans``
DATASET = "Dataset999_Tiny"


@pytest.fixture
def nnunet_dirs(tmp_path, monkeypatch) -> Path:
    preprocessed = tmp_path / "preprocessed" / DATASET / "nnUNetPlans_2d"
    preprocessed.mkdir(parents=True)
    (preprocessed / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    monkeypatch.setenv("nnUNet_preprocessed", str(tmp_path / "preprocessed"))
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "results"))
    monkeypatch.delenv("nnUNet_meddisseg_seed", raising=False)  # run seeds are random unless a test sets one
    torch.set_num_threads(2)
    return tmp_path
