"""nnUNetv2_meddisseg_ablate's pieces that need no training: budget trainers, variant names, settings."""
import importlib.util
import json

import pytest

from nnunetv2_meddisseg.ablation import ablate
from nnunetv2_meddisseg.ablation.runs import Budget, write_budget_trainers
from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.training import ablation_variants


def test_budget_trainers_subclass_each_variant_with_the_budget(tmp_path):
    variants = {"nnUNetTrainerMedDisSeg": "nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg",
                "nnUNetTrainerMedDisSeg_noStage1": "nnunetv2_meddisseg.training.ablation_variants"}
    file = write_budget_trainers(tmp_path, variants, Budget(epochs=8, iterations_per_epoch=3, val_iterations=None))
    spec = importlib.util.spec_from_file_location("generated_budget", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trainer = module.nnUNetTrainerMedDisSeg_noStage1_ablation.__new__(module.nnUNetTrainerMedDisSeg_noStage1_ablation)
    trainer.num_epochs, trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch = 1000, 250, 50
    module._budget(trainer)
    assert (trainer.num_epochs, trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch) == (8, 3, 50)
    assert issubclass(module.nnUNetTrainerMedDisSeg_noStage1_ablation,
                      ablation_variants.nnUNetTrainerMedDisSeg_noStage1)
    assert trainer.stage1_epochs == 0  # the variant's own override survives the budget
    full = module.nnUNetTrainerMedDisSeg_ablation.__new__(module.nnUNetTrainerMedDisSeg_ablation)
    full.num_epochs = 8
    assert full.stage1_epochs == 2


def test_variant_names_short_and_full_and_unknown(monkeypatch, tmp_path):
    monkeypatch.delenv("nnUNet_extTrainer", raising=False)
    resolved = ablate.resolve_variants(["noCBAT", "nnUNetTrainerMedDisSeg_tau0p5", "nnUNetTrainerMedDisSeg"])
    assert list(resolved) == ["nnUNetTrainerMedDisSeg", "nnUNetTrainerMedDisSeg_noCBAT",
                              "nnUNetTrainerMedDisSeg_tau0p5"]
    assert resolved["nnUNetTrainerMedDisSeg_noCBAT"] == "nnunetv2_meddisseg.training.ablation_variants"
    with pytest.raises(UserError, match=r"--variants: no trainer class named nnUNetTrainerMedDisSeg_noSuchThing"):
        ablate.resolve_variants(["noSuchThing"])


def test_rerun_with_another_budget_is_refused(tmp_path):
    settings = {"dataset": "Dataset501_X", "fold": "0", "plans": "nnUNetPlans", "epochs": 4}
    ablate._check_settings(tmp_path / "out", settings)
    assert json.loads((tmp_path / "out" / "settings.json").read_text()) == settings
    ablate._check_settings(tmp_path / "out", settings)  # the same settings: fine
    with pytest.raises(UserError, match=r"other settings \(epochs: 4 there, 8 now\).*another -o"):
        ablate._check_settings(tmp_path / "out", {**settings, "epochs": 8})


def test_bad_options_are_one_line_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("nnUNet_raw", str(tmp_path))
    assert ablate.main(["-d", "501", "--variants", "noCBAT", "--seeds", "0"]) == 2
    assert capsys.readouterr().err == "nnUNetv2_meddisseg_ablate: error: --seeds must be at least 1, got 0\n"
