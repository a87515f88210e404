"""Steps 3 (``main``), 4 (``epochs``) and the optional ``onnx`` of ``benchmarks/gpu.py``: nnU-Net's commands as users
type them, each within its cap (a ``gpu.Session``, which this module knows as :class:`Session`), and the figures
read from their logs."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from common import write_kvasir_split

from nnunetv2_meddisseg.ablation.runs import write_budget_plans
from nnunetv2_meddisseg.environment import nnunet_environment, planning_environment


class Session(Protocol):
    """What the steps use of ``gpu.Session`` (described here, so that the two modules do not import each other)."""

    args: object
    out: Path
    work: Path
    gpu: dict
    cli: dict

    def call(self, label: str, command: Sequence[str], env: Dict[str, str], key: str, step: str,
             reserve_s: float = 0.0) -> dict: ...

    def write(self) -> None: ...


REPO = Path(__file__).resolve().parents[1]
DATASET_ID = 990
#: seconds a training of the main command leaves to its own prediction and evaluation (at least what they need)
PREDICT_EVALUATE_FLOOR = (25, 10)
#: the default schedules, for the hours they take: (Stage I epochs, Stage II epochs, iterations per epoch)
DEFAULT_SCHEDULES = {"meddisseg": (250, 750, 250), "nnunet": (0, 1000, 250)}
#: console command -> its entry point (run as ``python -c``, so that a checkout works without installing)
ENTRY_POINTS = {
    "nnUNetv2_plan_and_preprocess":
        "nnunetv2.experiment_planning.plan_and_preprocess_entrypoints:plan_and_preprocess_entry",
    "nnUNetv2_train": "nnunetv2.run.run_training:run_training_entry",
    "nnUNetv2_predict": "nnunetv2.inference.predict_from_raw_data:predict_entry_point",
    "nnUNetv2_meddisseg_convert": "nnunetv2_meddisseg.datasets.convert:main",
    "nnUNetv2_meddisseg_plan": "nnunetv2_meddisseg.planning.plan_meddisseg:main",
    "nnUNetv2_meddisseg_evaluate": "nnunetv2_meddisseg.evaluation.evaluate:main",
}
COMPILED_GRAPH = re.compile(r'torch\.compile: graph "([^"]+)" compiled in ([0-9.]+) s')
COMPILE_DECISION = re.compile(r"torch\.compile: (on|off) \((.*)\)\s*$")


# ------------------------------------------------------------------------------------------------
# reading nnU-Net's logs


def epoch_times(log_text: str) -> List[float]:
    """nnU-Net's ``Epoch time: X s`` values of one training log, in order."""
    return [float(t) for t in re.findall(r"Epoch time: ([0-9.]+) s", log_text)]


def compile_figures(log_text: str) -> dict:
    """The trainer's compilation lines: ``{"decision": "on"|"off"|None, "reason": str|None, "compiled": bool,
    "compile_s": {graph: seconds} or None, "compile_s_total": float|None}`` (None where the log has no such line)."""
    decision = reason = None
    graphs: Dict[str, float] = {}
    for line in log_text.splitlines():
        found = COMPILE_DECISION.search(line)
        if found and decision is None:
            decision, reason = found.group(1), found.group(2)
        for name, seconds in COMPILED_GRAPH.findall(line):
            graphs[name] = graphs.get(name, 0.0) + float(seconds)
    # without a decision line: the trainers' lines of a compiled network ("torch.compile (inductor) of ...",
    # nnU-Net's "Using torch.compile..."), unless compilation was disabled or failed
    compiled = decision == "on" or bool(graphs) or (
        decision is None and re.search(r"torch\.compile \(\w+\) of |Using torch\.compile", log_text) is not None
        and not re.search(r"torch\.compile (disabled|failed)", log_text))
    return {"decision": decision, "reason": reason, "compiled": compiled, "compile_s": graphs or None,
            "compile_s_total": round(sum(graphs.values()), 1) if graphs else None}


def peak_memory_gib(log_text: str) -> Optional[float]:
    """The largest ``peak GPU memory X GiB`` of a training log, None where it has none."""
    memory = re.findall(r"peak GPU memory ([0-9.]+) GiB", log_text)
    return max(map(float, memory)) if memory else None


def training_log(results: Path, trainer: str) -> str:
    logs = sorted(results.rglob(f"{trainer}__*/fold_0/training_log_*.txt"))
    return logs[-1].read_text(errors="replace") if logs else ""

def console(name: str, args: Sequence[object]) -> List[str]:
    """``python -c`` calling the console command's entry point with ``args``."""
    module, function = ENTRY_POINTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
    return ["python", "-c", code, *map(str, args)]


def prepare_data(session: "Session", env: Dict[str, str]) -> Optional[Path]:
    """Convert, plan and preprocess the Kvasir-SEG subset, and Med-DisSeg's plans: the preprocessed folder, None
    where a command failed."""
    args, work = session.args, session.work
    d, processes = str(DATASET_ID), str(min(8, os.cpu_count() or 1))
    split = write_kvasir_split(work / "split.json", args.cases, "the first cases of each part of the shipped split")
    session.cli.update(cases={k: len(v) for k, v in split.items() if isinstance(v, list)}, size=args.size,
                       iterations_per_epoch=args.iterations)
    commands = [("convert", "nnUNetv2_meddisseg_convert", ["kvasir-seg", args.kvasir, "-d", d, "--resize", args.size,
                                                           "--split_file", work / "split.json", "--overwrite", "-np",
                                                           processes], env),
                ("plan_and_preprocess", "nnUNetv2_plan_and_preprocess",
                 ["-d", d, "-c", "2d", "-np", processes, "-npfp", processes], planning_environment(env)),
                ("meddisseg_plan", "nnUNetv2_meddisseg_plan", ["-d", d], env)]
    for label, name, command_args, step_env in commands:
        record = session.call(label, console(name, command_args), step_env, label, "main")
        session.cli["commands"].append(record)
        session.write()
        if record["rc"] != 0:
            return None
    preprocessed = preprocessed_folder(env)
    session.cli["plans"] = {}
    for plans in ("nnUNetMedDisSegPlans", "nnUNetPlans"):
        config = json.loads((preprocessed / f"{plans}.json").read_text())["configurations"]["2d"]
        session.cli["plans"][plans] = {"batch_size": config["batch_size"], "patch_size": config["patch_size"],
                                       "batch_size_source": config.get("batch_size_source")}
    return preprocessed


def preprocessed_folder(env: Dict[str, str]) -> Path:
    """The dataset's folder in ``nnUNet_preprocessed``."""
    return next(Path(env["nnUNet_preprocessed"]).glob(f"Dataset{DATASET_ID}_*"))


def train(session: "Session", label: str, trainer: str, plans: str, env: Dict[str, str], recipe: dict, key: str,
          step: str, reserve_s: float = 0.0) -> Tuple[dict, Path]:
    """``nnUNetv2_train`` with ``recipe`` (in a copy of ``plans``, ``write_budget_plans``) and its own results folder:
    the figures of its log and that folder."""
    work = session.work
    preprocessed = preprocessed_folder(env)
    budget_plans = write_budget_plans(preprocessed, plans, recipe)
    results = work / f"results_{label}"
    run_env = {**env, "nnUNet_results": str(results)}
    record = session.call(f"{label}_train", console("nnUNetv2_train", [DATASET_ID, "2d", "0", "-tr", trainer, "-p",
                                                                       budget_plans, "-device", session.args.device]),
                          run_env, key, step, reserve_s)
    session.cli["commands"].append(record)
    text = training_log(results, trainer)
    batch = session.cli.get("plans", {}).get(plans, {}).get("batch_size")
    times = epoch_times(text)
    figures = {"trainer": trainer, "plans": plans, "trained_plans": budget_plans, "batch_size": batch,
               "rc": record["rc"],
               "nnUNet_compile": env.get("nnUNet_compile", "unset (the trainer decides)"), "epoch_s": times,
               "peak_memory_gib": peak_memory_gib(text), **compile_figures(text)}
    return figures, results


def warm_epoch(figures: dict, index: int, iterations: int) -> Optional[dict]:
    """Seconds and training images/s of epoch ``index`` (None where the log does not have it)."""
    times = figures["epoch_s"]
    if len(times) <= index:
        return None
    images = iterations * (figures["batch_size"] or 0)
    return {"seconds": times[index], "images_per_s": round(images / times[index], 1) if images else None}


def main_step(session: "Session") -> None:
    """Step 3: prepare, then the main command with torch.compile forced on, then as the trainer decides."""
    args, work = session.args, session.work
    env = nnunet_environment(work)
    env.pop("nnUNet_compile", None)
    session.cli["completed_through_predict"] = False
    preprocessed = prepare_data(session, env)
    if preprocessed is None:
        return
    raw = next(Path(env["nnUNet_raw"]).glob(f"Dataset{DATASET_ID}_*"))
    tests = len(list((raw / "imagesTs").glob("*")))
    recipe = {"num_epochs": 3, "stage1_epochs": 1, "iterations_per_epoch": args.iterations,
              "val_iterations_per_epoch": args.val_iterations, "save_every": 1000, "final_validation": True}
    session.cli["main"], session.cli["epochs"] = {}, {}
    arms = [arm for arm in ("forced", "decided") if arm in args.main_arms]  # the compiled command first
    predict_floor, evaluate_floor = PREDICT_EVALUATE_FLOOR
    for arm in arms:
        arm_env = {**env, **({"nnUNet_compile": "t"} if arm == "forced" else {})}
        trainer, plans = "nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans"
        figures, results = train(session, f"main_{arm}", trainer, plans, arm_env, recipe, f"train_{arm}", "main",
                                 predict_floor + evaluate_floor)
        session.cli["main"][arm] = figures
        figures["stage1_epoch"] = warm_epoch(figures, 0, args.iterations)
        figures["stage2_warm_epoch"] = warm_epoch(figures, 2, args.iterations)
        compiled = figures["compiled"]
        session.cli["epochs"].setdefault(f"meddisseg_{'compiled' if compiled else 'eager'}", {
            "from": f"main {arm}", "compiled": compiled, "stage1_epoch": figures["stage1_epoch"],
            "stage2_warm_epoch": figures["stage2_warm_epoch"]})
        session.write()
        if figures["rc"] != 0:
            continue
        predictions = work / f"predictions_{arm}"
        # prediction as users type it: nnUNet_compile=t would make nnU-Net's predictor compile the network too
        env_results = {**env, "nnUNet_results": str(results)}
        record = session.call(f"main_{arm}_predict", console("nnUNetv2_predict", [
            "-i", raw / "imagesTs", "-o", predictions, "-d", DATASET_ID, "-c", "2d", "-f", "0", "-tr", trainer,
            "-p", figures["trained_plans"], "-device", args.device]), env_results, "predict", "main", evaluate_floor)
        session.cli["commands"].append(record)
        written = len(list(predictions.glob("*.png"))) if predictions.is_dir() else 0
        figures["predicted_cases"] = f"{written} of {tests}"
        figures["completed_through_predict"] = record["rc"] == 0 and written == tests
        if arm == "forced":
            session.cli["completed_through_predict"] = figures["completed_through_predict"] and compiled
            session.cli["compile_s"] = figures["compile_s"]
            session.cli["compile_s_total"] = figures["compile_s_total"]
        session.write()
        if record["rc"] == 0:
            summary_file = work / f"evaluation_{arm}.json"
            session.cli["commands"].append(session.call(f"main_{arm}_evaluate", console(
                "nnUNetv2_meddisseg_evaluate", ["-ref", raw / "labelsTs", "-pred", predictions, "-o", summary_file]),
                env_results, "evaluate", "main"))
            if summary_file.is_file():
                figures["test_mean"] = json.loads(summary_file.read_text()).get("mean")
            session.write()


def epochs_step(session: "Session") -> None:
    """Step 4: nnU-Net's default trainer, 2 epochs eager and compiled (and Med-DisSeg eager where step 3 has no
    eager run); the hours of the default schedules."""
    args = session.args
    env = nnunet_environment(session.work)
    if not any(Path(env["nnUNet_preprocessed"]).glob(f"Dataset{DATASET_ID}_*/nnUNetPlans.json")):
        session.cli.setdefault("epochs", {})["skipped"] = "no preprocessed data (step main did not prepare it)"
        session.write()
        return
    epochs = session.cli.setdefault("epochs", {})
    arms = [(f"baseline_{arm}", "nnUNetTrainerBaseline", "nnUNetPlans", arm) for arm in args.epoch_arms]
    if "meddisseg_eager" not in epochs:
        arms.insert(1, ("meddisseg_eager", "nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans", "eager"))
    for label, trainer, plans, arm in arms:
        meddisseg = "MedDisSeg" in trainer
        recipe = {"num_epochs": 3 if meddisseg else 2, "iterations_per_epoch": args.iterations,
                  "val_iterations_per_epoch": args.val_iterations, "final_validation": False, "save_every": 1000}
        recipe.update({"stage1_epochs": 1} if meddisseg else {})
        arm_env = {**env, "nnUNet_compile": "t" if arm == "compiled" else "f"}
        figures, _ = train(session, f"epochs_{label}", trainer, plans, arm_env, recipe, label, "epochs")
        if meddisseg:
            epochs[label] = {"from": "epochs", "stage1_epoch": warm_epoch(figures, 0, args.iterations),
                             "stage2_warm_epoch": warm_epoch(figures, 2, args.iterations), **figures}
        else:
            name = "nnunet_compiled" if arm == "compiled" else "nnunet_eager"
            epochs[name] = {"from": "epochs", "warm_epoch": warm_epoch(figures, 1, args.iterations), **figures}
        session.cli["default_schedule_hours"] = schedule_hours(epochs, args.iterations)
        session.write()


def schedule_hours(epochs: dict, iterations: int) -> Dict[str, Optional[float]]:
    """Hours of each trainer's default schedule (:data:`DEFAULT_SCHEDULES`) from the warm epoch of each run
    (seconds scaled from ``iterations`` to the schedule's iterations per epoch; Med-DisSeg's Stage I epochs at the
    first Stage I epoch's seconds, an upper bound: it includes the warm-up)."""
    hours = {}
    for key, figures in epochs.items():
        if not isinstance(figures, dict):
            continue
        stage1_epochs, stage2_epochs, schedule_iterations = DEFAULT_SCHEDULES[key.split("_")[0]]
        warm = figures.get("stage2_warm_epoch") or figures.get("warm_epoch")
        first = figures.get("stage1_epoch") or warm
        if not warm:
            hours[key] = None
            continue
        epoch_seconds = stage1_epochs * first["seconds"] + stage2_epochs * warm["seconds"]
        seconds = epoch_seconds * schedule_iterations / iterations
        hours[key] = round(seconds / 3600, 1)
    return hours


def onnx_step(session: "Session") -> None:
    """Optional step ``onnx``: ``benchmarks/onnx_predict.py`` on the step's device: nnU-Net's predictor against
    ONNX Runtime's TensorRT and CUDA providers (the CPU provider with ``--device cpu``) on the same generated
    ``--size`` images, ``--cases``' test count of them, with and without mirroring. Its own results files
    (``onnx_predict.json`` / ``.md``) go to OUT; the images/s and the agreement go to ``gpu_<device>``."""
    args = session.args
    threads = str(min(8, os.cpu_count() or 1))
    command = ["python", str(REPO / "benchmarks" / "onnx_predict.py"), "--device", args.device, "--size",
               str(args.size), "--num-images", str(args.cases[2]), "--repeats", str(min(args.repeats, 3)),
               "--threads", threads, "--no-forms", "--out", str(session.out), "--work", str(session.work / "onnx")]
    results = session.out / "onnx_predict.json"
    results.unlink(missing_ok=True)
    record = session.call("onnx", command, dict(os.environ), "onnx", "onnx")
    session.gpu["steps"]["onnx"] = {k: v for k, v in record.items() if k != "label"}
    if results.is_file():
        payload = json.loads(results.read_text())
        session.gpu["onnx"] = {"onnxruntime": payload.get("onnxruntime"), **payload["run"]}
    session.write()
