"""benchmarks/quality.py's pretrained arms through the real commands, on the CPU, at 32x32: default nnU-Net,
nnU-Net's default network + pretraining and Med-DisSeg + pretraining, 4 iterations each, one seed (3, so that the
pretraining's seed is not its default). Checks that each pretrained arm was pretrained by
``nnUNetv2_meddisseg_pretrain`` with the run's seed on the fold's training cases only, before its fine-tuning,
that the weights reached the fine-tuning (``-pretrained_weights``, ``--encoder_weights``), and the results file's
arms. Without training: the arms' summary on hand-made runs and the comparison at equal total minutes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nnunet_cli import fake_kvasir
from scipy import stats
from scratch import scratch_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quality  # noqa: E402
import quality_study  # noqa: E402

QUALITY = Path(__file__).resolve().parents[2] / "benchmarks" / "quality.py"
SEED, LABEL = 3, "iterations4_bs2"
ARMS = ("default", "default_pretrained", "meddisseg_pretrained")
FIELDS = {"method", "pretrained", "seeds", "test_mdsc_mean", "test_mdsc_sd", "delta_vs_default", "p_vs_default",
          "p_vs_scratch", "pretrain_minutes", "finetune_minutes"}


@pytest.fixture(scope="module")
def study(request, tmp_path_factory):
    """(work folder, results, markdown, stdout)."""
    tmp = scratch_folder(request, tmp_path_factory, "pretrain_study")
    kvasir, work, out = fake_kvasir(tmp / "Kvasir-SEG", (6, 2, 2)), tmp / "work", tmp / "results"
    command = [sys.executable, str(QUALITY), "--kvasir", str(kvasir), "--size", "32", "--iterations", "4",
               "--iterations-per-epoch", "1", "--batch", "2", "--methods", *ARMS, "--seeds", "1",
               "--first-seed", str(SEED), "--pretrain-epochs", "2", "--pretrain-iterations-per-epoch", "1",
               "--val-iterations", "1", "--no-final-validation", "--disable-tta", "--max-train-cases", "6",
               "--max-test-cases", "2", "--num-processes", "1", "--da-processes", "0", "--threads", "1",
               "--work", str(work), "--out", str(out), "--name", "pretrain_study"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (work, json.loads((out / "pretrain_study.json").read_text()), (out / "pretrain_study.md").read_text(),
            proc.stdout)


@pytest.mark.e2e
def test_each_pretrained_arm_is_pretrained_with_its_seed_on_training_cases_before_fine_tuning(study):
    from nnunetv2_meddisseg.torch_files import read_checkpoint

    work, results, _, stdout = study
    assert results["complete"] is True and results["pending"] == []
    splits = json.loads(next((work / "nnUNet_preprocessed").glob("Dataset*/splits_final.json")).read_text())[0]
    runs = {r["method"]: r for r in results["runs"]}
    assert sorted(runs) == sorted(ARMS) and {r["seed"] for r in runs.values()} == {SEED}
    assert "pretraining" not in runs["default"] and "pretrain_minutes" not in runs["default"]
    for key, network in (("default_pretrained", "nnunet_network"), ("meddisseg_pretrained", "meddisseg_encoder")):
        run, record = runs[key], runs[key]["pretraining"]
        weights = Path(record["file"])
        assert weights.is_file() and weights.parent.parent == work / "pretraining"
        assert record["seed"] == SEED and record["network"] == network and record["fold"] == "0"
        assert record["cases"] == len(splits["train"]) == 6 and record["validation_cases_used"] is False
        assert record["split"].endswith("splits_final.json") and record["epochs"] == 2
        assert len(record["losses"]) == 2 and record["batch_size"] == 2
        log = (work / "logs" / f"pretrain_{key}_seed{SEED}.log").read_text()
        assert f"--seed {SEED} " in log and "-f 0 " in log and "--use_validation_cases" not in log
        assert run["pretrain_minutes"] == pytest.approx(record["minutes"]) and run["pretrain_minutes"] > 0
        said = stdout.index(f"pretrain {key}_seed{SEED}: 2 x 1 batches of {record['plans']}")
        assert said < stdout.index(f"pretrained {key}_seed{SEED}: ") < stdout.index(f"start {key}_seed{SEED}")
        assert run["finetune_minutes"] == pytest.approx(run["train_wall_s"] / 60)
        # the fine-tuning started after the weights file was written
        fold = next((work / f"runs_{LABEL}_e4" / key / f"seed_{SEED}" / "nnUNet_results").glob("*/*/fold_0"))
        started = read_checkpoint(fold / "checkpoint_final.pth")["logging"]["epoch_start_timestamps"][0]
        assert started > weights.stat().st_mtime
    train_log = (work / f"runs_{LABEL}_e4" / "default_pretrained" / "logs"
                 / f"default_pretrained_seed{SEED}_train.log").read_text()
    weights = runs["default_pretrained"]["pretraining"]["file"]
    assert f"-pretrained_weights {weights}" in train_log and "Loading pretrained weights" in train_log
    plans = runs["meddisseg_pretrained"]["plans"]
    # the pretrained plans with the run's budget (quality.py's budget.json) as their recipe
    assert plans.startswith(f"nnUNetMedDisSegPlans_bs2_pretrained_seed{SEED}_budget_")
    content = json.loads(next((work / "nnUNet_preprocessed").glob(f"Dataset*/{plans}.json")).read_text())
    assert content["meddisseg_recipe"] == json.loads((work / f"runs_{LABEL}_e4" / "meddisseg_pretrained"
                                                      / "budget.json").read_text())
    assert (content["configurations"]["2d"]["architecture"]["arch_kwargs"]["encoder_weights"]
            == runs["meddisseg_pretrained"]["pretraining"]["file"])
    assert runs["meddisseg_pretrained"]["pretraining"]["plans"] == "nnUNetMedDisSegPlans_bs2"


@pytest.mark.e2e
def test_the_results_file_holds_the_arms(study):
    _, results, markdown, _ = study
    assert results["settings"]["pretraining"] == {"epochs": 2, "iterations_per_epoch": 1, "batch": 2, "fold": "0"}
    arms = {a["method"]: a for a in results["arms"][LABEL]}
    assert sorted(arms) == sorted(ARMS)
    runs = {r["method"]: r for r in results["runs"]}
    for key, arm in arms.items():
        assert FIELDS <= set(arm) and arm["seeds"] == [SEED]
        assert arm["pretrained"] is (key != "default")
        assert arm["test_mdsc_mean"] == pytest.approx(runs[key]["test_mean"]["dice"]) and arm["test_mdsc_sd"] is None
        assert arm["finetune_minutes"] == pytest.approx(runs[key]["train_wall_s"] / 60)
    assert arms["default"]["pretrain_minutes"] == 0 and arms["default"]["p_vs_scratch"] is None
    pretrained, scratch = runs["default_pretrained"], runs["default"]
    assert arms["default_pretrained"]["pretrain_minutes"] == pytest.approx(pretrained["pretrain_minutes"])
    difference = np.mean([pretrained["test_per_case"][c]["dice"] - scratch["test_per_case"][c]["dice"]
                          for c in scratch["test_per_case"]])
    assert arms["default_pretrained"]["delta_vs_scratch"] == pytest.approx(difference)
    assert arms["default_pretrained"]["delta_vs_default"] == pytest.approx(difference)
    assert arms["meddisseg_pretrained"]["p_vs_scratch"] is None  # its arm from scratch did not run
    assert "### Pretraining study: 4 training iterations per run at batch 2" in markdown
    assert "| Med-DisSeg + pretraining | yes | 1 |" in markdown


def _run(method, seed, dice, pretrain_minutes=None):
    cases = {f"case{i}": {"iou": d / (2 - d), "dice": d, "recall": d, "precision": d} for i, d in enumerate(dice)}
    run = {"method": method, "seed": seed, "status": "done", "val_dice": 0.5, "test_per_case": cases,
           "test_mean": {k: float(np.mean([c[k] for c in cases.values()])) for k in quality_study.METRICS},
           "train_wall_s": 120.0, "epoch_times_s": [60.0, 60.0], "iterations": 20, "curves": {}}
    if pretrain_minutes is not None:
        run["pretrain_minutes"] = pretrain_minutes
    return run


def test_arms_compare_to_default_and_to_their_arm_from_scratch():
    rng = np.random.default_rng(1)
    default = [rng.uniform(0.3, 0.9, 12) for _ in range(2)]
    scratch = [d - rng.uniform(0.0, 0.2, 12) for d in default]
    pretrained = [s + rng.uniform(-0.05, 0.15, 12) for s in scratch]
    runs = [_run("default", s, default[s]) for s in range(2)] + [_run("meddisseg", s, scratch[s]) for s in range(2)]
    runs += [_run("meddisseg_pretrained", s, pretrained[s], pretrain_minutes=1.0 + s) for s in range(2)]
    methods = ["default", "meddisseg", "meddisseg_pretrained"]
    arms = {a["method"]: a for a in quality_study.pretraining_arms(runs, quality_study.aggregate(runs, methods))}
    a = arms["meddisseg_pretrained"]
    to_scratch = (pretrained[0] + pretrained[1]) / 2 - (scratch[0] + scratch[1]) / 2
    to_default = (pretrained[0] + pretrained[1]) / 2 - (default[0] + default[1]) / 2
    assert a["pretrained"] is True and a["seeds"] == [0, 1]
    assert a["delta_vs_scratch"] == pytest.approx(to_scratch.mean())
    assert a["p_vs_scratch"] == pytest.approx(stats.wilcoxon(to_scratch).pvalue)
    assert a["delta_vs_default"] == pytest.approx(to_default.mean())
    assert a["p_vs_default"] == pytest.approx(stats.wilcoxon(to_default).pvalue)
    assert a["test_mdsc_sd"] == pytest.approx(np.std([p.mean() for p in pretrained], ddof=1))
    assert (a["pretrain_minutes"], a["finetune_minutes"], a["total_minutes"]) == (1.5, 2.0, 3.5)
    assert arms["meddisseg"]["pretrained"] is False and arms["meddisseg"]["p_vs_scratch"] is None
    assert arms["default"]["delta_vs_default"] == 0.0 and arms["default"]["p_vs_default"] is None


def test_validation_only_runs_compare_on_the_validation_cases():
    rng = np.random.default_rng(2)
    scratch = [rng.uniform(0.3, 0.9, 10) for _ in range(2)]
    pretrained = [s + rng.uniform(-0.1, 0.1, 10) for s in scratch]

    def validation_run(method, seed, dice):
        run = _run(method, seed, dice)
        run["val_per_case"] = run.pop("test_per_case")
        run.pop("test_mean")
        run["val_dice"] = float(np.mean(dice))
        return run

    runs = [validation_run("meddisseg", s, scratch[s]) for s in range(2)]
    runs += [validation_run("meddisseg_masked", s, pretrained[s]) for s in range(2)]
    table = quality_study.aggregate(runs, ["meddisseg", "meddisseg_masked"], "meddisseg")
    versus = table["meddisseg_masked"]["vs_baseline"]
    difference = (pretrained[0] + pretrained[1]) / 2 - (scratch[0] + scratch[1]) / 2
    assert versus["split"] == "val" and versus["mean_dice_difference"] == pytest.approx(difference.mean())
    assert versus["p_value"] == pytest.approx(stats.wilcoxon(difference).pvalue)
    assert table["meddisseg_masked"]["test"]["dice"]["mean"] is None
    arm = {a["method"]: a for a in quality_study.pretraining_arms(runs, table, "meddisseg")}["meddisseg_masked"]
    assert arm["compared_on"] == "val" and arm["pretraining_method"] == "masked"
    assert arm["val_mdsc_mean"] == pytest.approx(np.mean([p.mean() for p in pretrained]))


def test_equal_total_minutes_compare_with_the_scratch_arm_at_what_the_minutes_are_worth():
    rng = np.random.default_rng(3)
    short, long, pretrained = ([rng.uniform(0.3, 0.9, 12) for _ in range(2)] for _ in range(3))
    first = [{**_run("default", s, short[s]), "budget": "iterations20_bs4"} for s in range(2)]
    first += [{**_run("default_masked", s, pretrained[s], pretrain_minutes=1.0), "budget": "iterations20_bs4"}
              for s in range(2)]
    longer = [{**_run("default", s, long[s]), "budget": "iterations32_bs4"} for s in range(2)]

    def arms_with(amount, epochs=4):
        budgets = {"iterations20_bs4": {"kind": "iterations", "amount": 20, "batch": 4},
                   "iterations32_bs4": {"kind": "iterations", "amount": amount, "batch": 4}}
        arms = {"iterations20_bs4": quality_study.pretraining_arms(
            first, quality_study.aggregate(first, ["default", "default_masked"]))}
        quality_study.add_equal_minutes(arms, first + longer, budgets, epochs)
        return {a["method"]: a for a in arms["iterations20_bs4"]}, budgets

    # 20 iterations took 2 min of fine-tuning; with 1 min of pretraining the arm's 3 min are worth 30 iterations
    arms, budgets = arms_with(32)
    masked = arms["default_masked"]
    difference = (pretrained[0] + pretrained[1]) / 2 - (long[0] + long[1]) / 2
    assert masked["equal_minutes_iterations"] == pytest.approx(30) and masked["equal_minutes_budget"] == \
        "iterations32_bs4"
    assert masked["scratch_equal_minutes_mdsc_mean"] == pytest.approx(np.mean([x.mean() for x in long]))
    assert masked["delta_vs_scratch_equal_minutes"] == pytest.approx(difference.mean())
    assert masked["p_vs_scratch_equal_minutes"] == pytest.approx(stats.wilcoxon(difference).pvalue)
    assert masked["delta_vs_scratch"] == pytest.approx(np.mean((pretrained[0] + pretrained[1] - short[0] - short[1])
                                                              / 2))
    assert arms["default"]["equal_minutes_iterations"] is None and arms["default"]["equal_minutes_budget"] is None
    payload = {"settings": {}, "budgets": budgets, "arms": {"iterations20_bs4": list(arms.values())}}
    assert "| 32 (for 30) | " in "\n".join(quality_study._arms_markdown(payload))
    # more than one iteration per epoch away (36 for 30 in 4 epochs): not the same minutes; nor is the arm's own
    # budget (its scratch comparison is delta_vs_scratch)
    arms, budgets = arms_with(36)
    assert arms["default_masked"]["equal_minutes_budget"] is None
    payload = {"settings": {}, "budgets": budgets, "arms": {"iterations20_bs4": list(arms.values())}}
    assert "| 30 (not run) | – | – | – |" in "\n".join(quality_study._arms_markdown(payload))
    assert arms_with(60, epochs=10)[0]["default_masked"]["equal_minutes_budget"] is None  # 20 is within 10 of 30


@pytest.mark.parametrize("argv, message", [
    (["--methods", "default", "meddisseg_pretrained", "--encoder-weights", "w.pth"],
     "--encoder-weights: the pretrained arms .meddisseg_pretrained. take their encoder from the pretraining"),
    (["--methods", "default", "default_pretrained", "--pretrain-epochs", "0"],
     "--pretrain-epochs and --pretrain-iterations-per-epoch must be at least 1, got 0 and 20"),
    (["--first-seed", "-1"], "--first-seed must be at least 0"),
])
def test_pretraining_command_line_errors(argv, message):
    with pytest.raises(SystemExit, match=message):
        quality.main(["--kvasir", "/nonexistent", *argv])


def test_every_arm_names_a_plans_family_whose_recipe_file_the_planner_accepts():
    from nnunetv2_meddisseg.planning.plan_meddisseg import _read_recipe

    for key, method in quality_study.METHODS.items():
        assert method.family == "nnunet" or method.family in quality_study.MEDDISSEG_PLANS, key
        assert method.scratch is None or quality_study.METHODS[method.scratch].family == method.family, key
    arguments = quality_study.MEDDISSEG_PLANS["meddisseg_encoder_lr"][1]
    assert _read_recipe(arguments[arguments.index("--recipe") + 1]) == {"stage2_encoder_lr": 1e-4}


def test_results_files_write_the_home_folder_as_a_tilde(tmp_path, monkeypatch):
    from common import write_results

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))  # Path.home() on POSIX
    machine = {"date": "today", "cpu": "cpu", "cpu_cores": 2, "torch_threads": 2, "load_average_1_5_15min": [0, 0, 0],
               "torch": "t", "nnunetv2": "n", "dynamic_network_architectures": "d", "python": "p"}
    payload = {"machine": machine, "command": f"python quality.py --work {home}/study",
               "runs": [{"file": f"{home}/study/seed_0.pth", "elsewhere": f"{tmp_path}/other"}]}
    files = write_results(tmp_path / "out", "r", payload, f"work folder {home}/study")
    written = json.loads(files["json"].read_text())
    assert written["command"] == "python quality.py --work ~/study"
    assert written["runs"] == [{"file": "~/study/seed_0.pth", "elsewhere": f"{tmp_path}/other"}]
    assert str(home) not in files["markdown"].read_text() and "work folder ~/study" in files["markdown"].read_text()
