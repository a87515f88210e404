"""nnUNetv2_meddisseg_ablate's pieces that need no training: the budget plans, variant names, network-ablation
plans, settings."""
import json

import pytest

from nnunetv2_meddisseg.ablation import ablate
from nnunetv2_meddisseg.ablation.runs import AblationRun, Variant, write_budget_plans, write_network_ablation_plans
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.training.recipe import RECIPE_PLANS_KEY, recipe_from_plans
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_noStage1


def test_the_budget_plans_are_a_copy_of_the_plans_with_the_budget_as_recipe(tmp_path):
    source = {"plans_name": "P", "configurations": {"2d": {"batch_size": 3}}}
    (tmp_path / "P.json").write_text(json.dumps(source))
    budget = {"num_epochs": 8, "iterations_per_epoch": 3, "final_validation": False}
    name = write_budget_plans(tmp_path, "P", budget)
    written = json.loads((tmp_path / f"{name}.json").read_text())
    assert name.startswith("P_budget_") and written == {**source, "plans_name": name, RECIPE_PLANS_KEY: budget}
    assert write_budget_plans(tmp_path, "P", dict(reversed(budget.items()))) == name  # the same settings
    assert write_budget_plans(tmp_path, "P", {**budget, "num_epochs": 9}) != name
    assert json.loads((tmp_path / "P.json").read_text()) == source  # the input is left as it was
    recipe = recipe_from_plans(nnUNetTrainerMedDisSeg_noStage1.recipe, written)
    assert (recipe.num_epochs, recipe.iterations_per_epoch, recipe.stage1_fraction) == (8, 3, 0.0)
    with pytest.raises(UserError, match="Q.json not found"):
        write_budget_plans(tmp_path, "Q", budget)
    (tmp_path / "R.json").write_text(json.dumps({**source, RECIPE_PLANS_KEY: {"num_epochs": 100, "stage2_lr": 0.5}}))
    merged = json.loads((tmp_path / f"{write_budget_plans(tmp_path, 'R', budget)}.json").read_text())
    assert merged[RECIPE_PLANS_KEY] == {**budget, "stage2_lr": 0.5}  # the plans' own settings kept, the budget's won
    run = AblationRun(tmp_path, "Dataset501_X", "0", {"a": Variant("nnUNetTrainerMedDisSeg", name)}, "cpu",
                      tmp_path, tmp_path, {})
    env = run.environment(2)
    assert env["nnUNet_meddisseg_seed"] == "2" and "nnUNet_meddisseg_recipe" not in env
    assert run.fold_folder("a", 2) == tmp_path / "seed_2" / "nnUNet_results" / "Dataset501_X" / \
        f"nnUNetTrainerMedDisSeg__{name}__2d" / "fold_0"


def test_variant_names_short_and_full_network_ablations_and_unknown(monkeypatch, tmp_path):
    monkeypatch.delenv("nnUNet_extTrainer", raising=False)
    resolved = ablate.resolve_variants(["noCBAT", "nnUNetTrainerMedDisSeg_tau0p5", "nnUNetTrainerMedDisSeg", "ReLU"],
                                       "nnUNetMedDisSegPlans")
    assert resolved == {"nnUNetTrainerMedDisSeg": Variant("nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans"),
                        "nnUNetMedDisSegPlans_noCBAT": Variant("nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans_noCBAT"),
                        "nnUNetTrainerMedDisSeg_tau0p5": Variant("nnUNetTrainerMedDisSeg_tau0p5",
                                                                 "nnUNetMedDisSegPlans"),
                        "nnUNetMedDisSegPlans_ReLU": Variant("nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans_ReLU")}
    assert list(resolved)[0] == "nnUNetTrainerMedDisSeg"
    with pytest.raises(UserError, match=r"--variants: no trainer class named nnUNetTrainerMedDisSeg_noSuchThing"):
        ablate.resolve_variants(["noSuchThing"], "nnUNetPlans")


def test_network_ablation_plans_change_one_option_and_keep_the_rest(tmp_path):
    from nnunetv2_meddisseg.plans_architecture import default_arch_kwargs

    meddisseg = {"plans_name": "P", "configurations": {"2d": {"batch_size": 3, "architecture": {
        "network_class_name": "nnunetv2_meddisseg.architectures.MedDisSegNet",
        "arch_kwargs": {**default_arch_kwargs(activation="relu"), "encoder_weights": "w.pth"},
        "_kw_requires_import": ["conv_op", "norm_op"]}}}}
    (tmp_path / "P.json").write_text(json.dumps(meddisseg))
    assert write_network_ablation_plans(tmp_path, "P", "noCBAT") == "P_noCBAT"
    written = json.loads((tmp_path / "P_noCBAT.json").read_text())
    kwargs = written["configurations"]["2d"]["architecture"]["arch_kwargs"]
    assert written["plans_name"] == "P_noCBAT" and written["configurations"]["2d"]["batch_size"] == 3
    assert kwargs == {**meddisseg["configurations"]["2d"]["architecture"]["arch_kwargs"], "cbat": False}
    nnunet = {"plans_name": "nnUNetPlans", "configurations": {"2d": {"batch_size": 12, "architecture": {
        "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet", "arch_kwargs": {}}}}}
    (tmp_path / "nnUNetPlans.json").write_text(json.dumps(nnunet))
    write_network_ablation_plans(tmp_path, "nnUNetPlans", "noELAT")
    plans = json.loads((tmp_path / "nnUNetPlans_noELAT.json").read_text())
    architecture = plans["configurations"]["2d"]["architecture"]
    assert architecture["arch_kwargs"] == default_arch_kwargs(elat=False)
    assert architecture["network_class_name"].endswith("MedDisSegNet")
    with pytest.raises(UserError, match="Q.json not found"):
        write_network_ablation_plans(tmp_path, "Q", "ReLU")


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
