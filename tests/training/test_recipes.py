"""The recipes: defaults are the paper's, each named variant changes what its name says, values and
overrides are checked with one-line errors, and the plans' overrides set a trainer's budget."""
import dataclasses

import pytest
import torch
from test_trainer_meddisseg import PLAIN_UNET, make_batch, make_trainer, tiny_plans

from nnunetv2_meddisseg.ablation import study_trainers
from nnunetv2_meddisseg.nnunet_trainers import meddisseg_trainers
from nnunetv2_meddisseg.training import variants
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg_paper import nnUNetTrainerMedDisSeg_paper
from nnunetv2_meddisseg.training.recipe import (
    RECIPE_PLANS_KEY,
    DispersiveRecipe,
    MedDisSegRecipe,
    PaperScheduleRecipe,
    ScheduleRecipe,
    apply_overrides,
    read_override_file,
)
from nnunetv2_meddisseg.training.variants import (
    DEMO_SCHEDULE,
    PLAIN_TRAINING,
    SCRATCH_ADAM,
    SCRATCH_SGD,
    SCRATCH_SGD_CENTRED,
    SMOKE_SCHEDULE,
)

#: the paper's stated settings: "(lambda_1, lambda_2) = (0.2, 0.6), early placement, and tau = 0.8"; "optimizer
#: (Adam), learning-rate schedule (cosine; base LR 1e-4) ... number of epochs (300), and early-stopping
#: patience (100)"; Stage II fine-tunes the encoder "with a smaller learning rate"
PAPER = {"lambda_dispersive_stage1": 0.2, "lambda_dispersive_stage2": 0.6, "dispersive_placement": "early",
         "dispersive_tau": 0.8, "dispersive_variant": "infonce_l2", "optimizer": "adam", "stage1_lr": 1e-4,
         "stage2_lr": 1e-4}


def test_the_default_recipe_is_the_papers():
    recipe = nnUNetTrainerMedDisSeg.recipe
    assert {k: getattr(recipe, k) for k in PAPER} == PAPER
    assert recipe.stage2_encoder_lr < recipe.stage2_lr
    assert recipe.stage1_fraction == 0.25
    paper = nnUNetTrainerMedDisSeg_paper.recipe
    assert (paper.num_epochs, paper.early_stopping_patience) == (300, 100)
    assert {k: getattr(paper, k) for k in PAPER} == PAPER


#: every trainer of the catalogue, by its name without "nnUNetTrainer", and its recipe
RECIPES = {name[len("nnUNetTrainer"):]: getattr(meddisseg_trainers, name).recipe for name in meddisseg_trainers.__all__}

#: SCRATCH_ADAM's settings that differ from the paper's (whose optimizer is Adam already)
ADAM_CHANGES = {name: value for name, value in SCRATCH_ADAM.items() if name != "optimizer"}

#: trainer name -> the settings its name says it changes (written out here, not read from the trainers)
NAMED_CHANGES = {
    "MedDisSeg_smoke": {**SMOKE_SCHEDULE, "stage1_epochs": 1, "batchnorm_calibration_samples": 2},
    "MedDisSeg_250epochs": {"num_epochs": 250},
    "MedDisSeg_100epochs": {"num_epochs": 100},
    "MedDisSeg_demo": {**DEMO_SCHEDULE, **ADAM_CHANGES, "batchnorm_calibration_samples": 16,
                       "batchnorm_calibration_augmentation": False},
    "MedDisSeg_noDispersive": {"lambda_dispersive_stage1": 0.0, "lambda_dispersive_stage2": 0.0},
    "MedDisSeg_dispersiveStage1Only": {"lambda_dispersive_stage2": 0.0},
    "MedDisSeg_dispersiveStage2Only": {"lambda_dispersive_stage1": 0.0},
    "MedDisSeg_cosine": {"dispersive_variant": "infonce_cosine"},
    "MedDisSeg_hinge": {"dispersive_variant": "hinge"},
    "MedDisSeg_covariance": {"dispersive_variant": "covariance"},
    "MedDisSeg_cosineCentred": {"dispersive_variant": "infonce_cosine_centred"},
    "MedDisSeg_middle": {"dispersive_placement": "middle"},
    "MedDisSeg_late": {"dispersive_placement": "late"},
    "MedDisSeg_allLayers": {"dispersive_placement": "all"},
    "MedDisSeg_tau0p1": {"dispersive_tau": 0.1},
    "MedDisSeg_tau0p5": {"dispersive_tau": 0.5},
    "MedDisSeg_tau1p0": {"dispersive_tau": 1.0},
    "MedDisSeg_lambda0p2": {"lambda_dispersive_stage2": 0.2},
    "MedDisSeg_lambda1p0": {"lambda_dispersive_stage2": 1.0},
    "MedDisSeg_noStage1": {"stage1_fraction": 0.0},
    "MedDisSeg_scratchSGD": {**SCRATCH_SGD},
    "MedDisSeg_scratchSGDCentred": {**SCRATCH_SGD_CENTRED},
    "MedDisSeg_scratchAdam": {**ADAM_CHANGES},
    "MedDisSeg_plainSGD": {**PLAIN_TRAINING, **SCRATCH_SGD},
    "MedDisSeg_plainAdam": {**PLAIN_TRAINING, **ADAM_CHANGES},
    "MedDisSeg_plainPaper": dict(PLAIN_TRAINING),
    "MedDisSeg_runningStatistics": {"stage1_checkpoint": True},
    "MedDisSeg_plainPaperRunningStatistics": {**PLAIN_TRAINING, "stage1_checkpoint": True},
    "Dispersive_smoke": {"num_epochs": 1, "iterations_per_epoch": 4, "val_iterations_per_epoch": 2},
    "Dispersive_infonceL2": {"dispersive_variant": "infonce_l2"},
    "Dispersive_cosine": {"dispersive_variant": "infonce_cosine"},
    "Baseline_smoke": {"num_epochs": 3, "iterations_per_epoch": 4, "val_iterations_per_epoch": 2},
    "Baseline_demo": dict(DEMO_SCHEDULE),
}
DEFAULTS = {"MedDisSeg": MedDisSegRecipe(), "Dispersive": DispersiveRecipe(), "Baseline": ScheduleRecipe()}


def _differences(recipe, default) -> dict:
    return {f.name: getattr(recipe, f.name) for f in dataclasses.fields(recipe)
            if getattr(recipe, f.name) != getattr(default, f.name)}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_differs_from_its_default_in_what_its_name_says(name):
    recipe = RECIPES[name]
    if name in DEFAULTS or name == "MedDisSeg_paper":
        assert recipe == (DEFAULTS.get(name) or PaperScheduleRecipe())
        return
    default = DEFAULTS[name.split("_")[0]]
    assert type(recipe) is type(default)
    assert _differences(recipe, default) == NAMED_CHANGES[name]


def test_every_trainer_is_in_the_catalogue_and_no_two_variants_are_equal():
    exported = set(variants.__all__) | set(study_trainers.__all__) | {
        "nnUNetTrainerMedDisSeg", "nnUNetTrainerDispersive", "nnUNetTrainerMedDisSeg_paper"}
    assert {f"nnUNetTrainer{name}" for name in RECIPES} == exported
    assert set(NAMED_CHANGES) | set(DEFAULTS) | {"MedDisSeg_paper"} == set(RECIPES)
    seen = {}
    for name, recipe in RECIPES.items():
        twin = [other for other, r in seen.items() if r == recipe and type(r) is type(recipe)]
        assert not twin, f"{name} equals {twin}: remove it"
        seen[name] = recipe


@pytest.mark.parametrize("settings, message", [
    ({"stage1_lr": 0.0}, "MedDisSegRecipe.stage1_lr must be a finite number > 0, got 0.0"),
    ({"optimizer": "rmsprop"}, "MedDisSegRecipe.optimizer must be one of ('adam', 'sgd'), got 'rmsprop'"),
    ({"dispersive_placement": "decoder"}, "MedDisSegRecipe.dispersive_placement must be one of"),
    ({"stage1_fraction": 1.5}, "MedDisSegRecipe.stage1_fraction must be a finite number >= 0 and <= 1"),
    ({"num_epochs": 2.5}, "MedDisSegRecipe.num_epochs must be an integer >= 1 (or null), got 2.5"),
    ({"final_validation": "no"}, "MedDisSegRecipe.final_validation must be true or false, got 'no'"),
    ({"lambda_dispersive_stage2": -0.1}, "MedDisSegRecipe.lambda_dispersive_stage2 must be a finite number >= 0"),
])
def test_bad_values_are_one_line_errors_naming_the_field(settings, message):
    with pytest.raises(ValueError) as error:
        MedDisSegRecipe(**settings)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_unknown_override_is_a_one_line_error_naming_the_key_and_the_source():
    with pytest.raises(ValueError) as error:
        apply_overrides(DispersiveRecipe(), {"dispersive_weight": 0.5}, "budget.json")
    message = str(error.value)
    assert message.startswith("budget.json: unknown setting 'dispersive_weight' for DispersiveRecipe")
    assert "lambda_dispersive" in message and "\n" not in message
    with pytest.raises(ValueError, match="^budget.json: MedDisSegRecipe.stage2_lr must be"):
        apply_overrides(MedDisSegRecipe(), {"stage2_lr": "fast"}, "budget.json")


def _with_recipe(overrides, plans=None) -> dict:
    plans = tiny_plans() if plans is None else plans
    plans[RECIPE_PLANS_KEY] = overrides
    return plans


def test_plans_overrides_errors_name_the_plans_and_the_key(nnunet_dirs):
    source = f"plans nnUNetPlans: {RECIPE_PLANS_KEY}"
    with pytest.raises(ValueError, match=f"^{source}: unknown setting 'iterations_per_epcoh'"):
        make_trainer(plans=_with_recipe({"num_epochs": 2, "iterations_per_epcoh": 3}), initialize=False)
    with pytest.raises(ValueError, match=f"^{source}: expected an object of recipe settings, got list"):
        make_trainer(plans=_with_recipe([1, 2]), initialize=False)
    with pytest.raises(ValueError, match=f"^{source}: MedDisSegRecipe.num_epochs must be"):
        make_trainer(plans=_with_recipe({"num_epochs": "many"}), initialize=False)


def test_override_file_errors_name_the_file(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"^{path}: expected a JSON object"):
        read_override_file(str(path))
    path.write_text('{"num_epochs": ')
    with pytest.raises(ValueError, match=f"^{path}: not a JSON file of recipe settings"):
        read_override_file(str(path))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'missing.json'}: cannot read the recipe file"):
        read_override_file(str(tmp_path / "missing.json"))


def test_plans_overrides_set_the_budget_of_any_trainer(nnunet_dirs):
    budget = {"num_epochs": 2, "iterations_per_epoch": 3, "val_iterations_per_epoch": 1, "final_validation": False,
              "torch_threads": 1}
    threads = torch.get_num_threads()
    try:
        for cls, plans in ((variants.nnUNetTrainerMedDisSeg_tau0p5, None),
                           (nnUNetTrainerDispersive, tiny_plans(PLAIN_UNET)),
                           (variants.nnUNetTrainerBaseline, tiny_plans(PLAIN_UNET))):
            trainer = make_trainer(cls, plans=_with_recipe(budget, plans), initialize=False)
            assert (trainer.num_epochs, trainer.num_iterations_per_epoch, trainer.num_val_iterations_per_epoch) == \
                (2, 3, 1)
            assert torch.get_num_threads() == 1 and trainer.recipe.final_validation is False
        assert trainer.recipe == ScheduleRecipe(num_epochs=2, iterations_per_epoch=3, val_iterations_per_epoch=1,
                                                final_validation=False, torch_threads=1)
        tau = make_trainer(variants.nnUNetTrainerMedDisSeg_tau0p5, plans=_with_recipe(budget), initialize=False)
        assert tau.recipe.dispersive_tau == 0.5 and tau.stage1_epochs == 0  # floor(0.25 * 2)
        plain = make_trainer(variants.nnUNetTrainerMedDisSeg_tau0p5, initialize=False)  # plans without the key
        assert plain.recipe == variants.nnUNetTrainerMedDisSeg_tau0p5.recipe
    finally:
        torch.set_num_threads(threads)


@pytest.mark.e2e  # the whole network trained through a trainer (the quick loop leaves it out)
def test_a_budget_trains_for_the_stated_iterations(nnunet_dirs):
    """nnU-Net's run_training on plans with a budget: 2 epochs of 3 training and 1 validation iterations, the
    final validation skipped."""
    trainer = make_trainer(plans=_with_recipe({"num_epochs": 2, "stage1_epochs": 1, "iterations_per_epoch": 3,
                                               "val_iterations_per_epoch": 1, "final_validation": False}),
                           initialize=False)
    steps, validations, finals = [], [], []
    batch = make_batch()
    trainer.on_train_start = lambda: None  # no dataloaders: run_training's loop on one in-memory batch
    trainer.on_train_end = lambda: trainer.perform_actual_validation() or finals.append("called")
    trainer.dataloader_train = trainer.dataloader_val = iter(lambda: batch, None)
    trainer.initialize()
    train_step, validation_step = trainer.train_step, trainer.validation_step
    trainer.train_step = lambda b: steps.append(trainer.current_epoch) or train_step(b)
    trainer.validation_step = lambda b: validations.append(trainer.current_epoch) or validation_step(b)
    trainer.run_training()
    assert steps == [0, 0, 0, 1, 1, 1] and validations == [0, 1]
    assert "final validation skipped" in open(trainer.log_file).read()


def _readme_section(title: str) -> str:
    """A section of docs/method.md (moved there from the README), up to the next subsection."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "method.md").read_text()
    start = text.index(title)
    return text[start:text.index("\n### ", start + len(title))]


def test_readme_lists_every_setting_and_its_three_line_variant_works():
    import re

    section = _readme_section("### Defaults and how to change them")
    listed = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            listed.update(re.findall(r"`(\w+)`", row.split("|")[1]))
    fields = {f.name for f in dataclasses.fields(MedDisSegRecipe)}
    assert listed == fields, (sorted(fields - listed), sorted(listed - fields))
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) == 3
    namespace: dict = {}
    exec(code, namespace)
    variant = namespace["nnUNetTrainerMedDisSeg_tau0p4"]
    assert _differences(variant.recipe, MedDisSegRecipe()) == {"dispersive_tau": 0.4}
