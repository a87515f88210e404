"""nnU-Net's own commands with Med-DisSeg on one CUDA GPU: the main command end to end, and seconds per epoch.

On the first ``--cases`` train / validation / test cases of the shipped Kvasir-SEG split at ``--size``:
``main`` runs ``nnUNetv2_plan_and_preprocess``, ``nnUNetv2_meddisseg_plan``, ``nnUNetv2_train -tr
nnUNetTrainerMedDisSeg_smoke`` compiled as nnU-Net runs it by default, ``nnUNetv2_predict`` and
``nnUNetv2_meddisseg_evaluate``; ``epochs`` trains both trainers (fp16 / bf16, eager / compiled) and reads the
seconds per epoch of each stage from nnU-Net's logs (the last epoch of a stage; its first includes warm-up and
compilation). ``completed_through_predict`` is true only when the prediction after the compiled training wrote
every test case. Each command stops at the time left (``--budget-s``); logs are under ``WORK/logs``. A later run
on the same ``--work`` reuses its data and plans and adds to the results.
"""
import json
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from common import PartialResults, argument_parser, markdown_table
from nnunetv2_meddisseg.logged_command import run_logged_status

REPO = Path(__file__).resolve().parents[1]
DATASET_ID = 990
ITERATIONS = 50
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


def command_line(name: str, args: Sequence[object]) -> List[str]:
    """``python -c`` calling the console command's entry point with ``args``."""
    module, function = ENTRY_POINTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
    return ["python", "-c", code, *map(str, args)]


class Run(PartialResults):
    """Commands with logs and a deadline; the results rewritten after each."""

    def __init__(self, work: Path, out: Path, budget_s: float) -> None:
        import torch

        super().__init__(out, "gpu_cli", torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU",
                         budget_s, markdown)
        self.work, self.logs = work, work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        for key in ("compile_s", "epoch_s", "peak_memory_gib"):
            self.data.setdefault(key, {})
        self.data.setdefault("commands", [])
        self.data.setdefault("completed_through_predict", False)

    def call(self, label: str, name: str, args: Sequence[object], env: Dict[str, str]) -> dict:
        log = self.logs / f"{label}.log"
        rc, seconds = run_logged_status(command_line(name, args), env, log, echo=False, timeout_s=max(1.0, self.left()))
        record = {"label": label, "command": name, "rc": "timeout" if rc is None else rc, "seconds": round(seconds, 1),
                  "log": str(log.relative_to(self.work))}
        self.data["commands"].append(record)
        print(f"{label}: rc {record['rc']} in {record['seconds']} s", flush=True)
        self.write()
        return record

    def note_peak_memory(self, label: str, log_text: str) -> None:
        """The largest ``peak GPU memory X GiB`` of a training log, where it has one."""
        memory = re.findall(r"peak GPU memory ([0-9.]+) GiB", log_text)
        if memory:
            self.data["peak_memory_gib"][label] = max(map(float, memory))


def markdown(data: dict) -> str:
    lines = [f"# nnU-Net's commands on {data['device']}", "", f"torch {data['torch']}; `{data['command']}`", "",
             f"Compiled `nnUNetv2_train` through `nnUNetv2_predict`: **{data['completed_through_predict']}**", ""]
    if data.get("epoch_s"):
        rows = [[run, f.get("meddisseg_stage1", f.get("nnunet", "-")), f.get("meddisseg_stage2", "-")]
                for run, f in data["epoch_s"].items()]
        lines += [markdown_table(["run", "Stage I s / epoch", "Stage II s / epoch"], rows), ""]
    for key in ("compile_s", "peak_memory_gib"):
        if data.get(key):
            lines += [markdown_table([key, ""], list(data[key].items())), ""]
    commands = [[c["label"], c["rc"], c["seconds"]] for c in data["commands"]]
    lines.append(markdown_table(["command", "rc", "seconds"], commands))
    return "\n".join(lines) + "\n"


def epoch_times(log_text: str) -> List[float]:
    """nnU-Net's ``Epoch time: X s`` values of one training log, in order."""
    return [float(t) for t in re.findall(r"Epoch time: ([0-9.]+) s", log_text)]


def first_step_seconds(log_text: str) -> Dict[str, float]:
    """``{stage<N>_<training|validation>_first_step: seconds}`` from the trainer's log lines on its compiled
    first steps (compilation included)."""
    found = re.findall(r"first (training|validation) step of Stage (I+): ([0-9.]+) s", log_text)
    return {f"stage{len(stage)}_{kind}_first_step": float(seconds) for kind, stage, seconds in found}


def training_log(results: Path, trainer: str) -> str:
    logs = sorted(results.rglob(f"{trainer}__*/fold_0/training_log_*.txt"))
    return logs[-1].read_text(errors="replace") if logs else ""


def write_split(target: Path, counts: Sequence[int]) -> dict:
    shipped = json.loads((REPO / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json").read_text())
    split = {"description": "the first cases of each part of the shipped Kvasir-SEG split",
             **{key: shipped[key][:n] for key, n in zip(("train", "val", "test"), counts)}}
    target.write_text(json.dumps(split, indent=1) + "\n")
    return split


def main(argv=None) -> int:
    parser = argument_parser(__doc__, "gpu_cli_<device>")
    parser.add_argument("--kvasir", type=Path, required=True, help="Kvasir-SEG folder (images/, masks/)")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--cases", type=int, nargs=3, default=(40, 8, 10), metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--work", type=Path, default=Path("gpu_cli_work"))
    parser.add_argument("--budget-s", type=float, default=900.0)
    parser.add_argument("--parts", nargs="+", choices=("main", "epochs"), default=("main", "epochs"))
    parser.add_argument("--device", default="cuda", help="-device of nnUNetv2_train / nnUNetv2_predict")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="iterations per epoch of the epochs part")
    args = parser.parse_args(argv)
    from nnunetv2_meddisseg.environment import nnunet_environment, planning_environment

    work = args.work.resolve()
    run = Run(work, args.out, args.budget_s)
    env = nnunet_environment(work)
    env.pop("nnUNet_compile", None)  # nnU-Net's default: compile on a GPU
    d, processes = str(DATASET_ID), str(min(8, os.cpu_count() or 1))
    split = write_split(work / "split.json", args.cases)
    run.data.update(cases={k: len(v) for k, v in split.items() if isinstance(v, list)}, size=args.size,
                    iterations_per_epoch=args.iterations)
    steps = [("convert", "nnUNetv2_meddisseg_convert", ["kvasir-seg", args.kvasir, "-d", d, "--resize", args.size,
                                                         "--split-file", work / "split.json", "--overwrite", "-np",
                                                         processes], env),
             ("plan_and_preprocess", "nnUNetv2_plan_and_preprocess", ["-d", d, "-c", "2d", "-np", processes, "-npfp",
                                                                      processes], planning_environment(env)),
             ("meddisseg_plan", "nnUNetv2_meddisseg_plan", ["-d", d], env)]
    planned = list(Path(env["nnUNet_preprocessed"]).glob(f"Dataset{DATASET_ID}_*/nnUNetMedDisSegPlans.json"))
    for label, name, command_args, step_env in ([] if planned else steps):  # planned by an earlier run: reused
        if run.call(label, name, command_args, step_env)["rc"] != 0:
            return 1
    preprocessed = next(Path(env["nnUNet_preprocessed"]).glob(f"Dataset{DATASET_ID}_*"))
    config = json.loads((preprocessed / "nnUNetMedDisSegPlans.json").read_text())["configurations"]["2d"]
    run.data["plan"] = {"batch_size": config["batch_size"], "batch_size_source": config.get("batch_size_source")}
    raw = next(Path(env["nnUNet_raw"]).glob(f"Dataset{DATASET_ID}_*"))
    results = Path(env["nnUNet_results"])

    if "main" in args.parts:
        trainer = "nnUNetTrainerMedDisSeg_smoke"
        train = run.call("main_train", "nnUNetv2_train", [d, "2d", "0", "-tr", trainer, "-p", "nnUNetMedDisSegPlans",
                                                          "-device", args.device], env)
        text = training_log(results, trainer)
        run.data["main_training"] = {"compiled": "torch.compile" in text and "torch.compile failed" not in text,
                                     "epoch_s": epoch_times(text), "rc": train["rc"]}
        run.note_peak_memory("main_training", text)
        run.data["compile_s"].update(first_step_seconds(text))
        if train["rc"] == 0:
            predictions = work / "predictions"
            predict = run.call("main_predict", "nnUNetv2_predict", [
                "-i", raw / "imagesTs", "-o", predictions, "-d", d, "-c", "2d", "-f", "0", "-tr", trainer, "-p",
                "nnUNetMedDisSegPlans", "-device", args.device], env)
            written = sorted(predictions.glob("*.png")) if predictions.is_dir() else []
            run.data["predicted_cases"] = len(written)
            run.data["completed_through_predict"] = (predict["rc"] == 0 and run.data["main_training"]["compiled"]
                                                     and len(written) == len(split["test"]))
            if predict["rc"] == 0:
                run.call("main_evaluate", "nnUNetv2_meddisseg_evaluate", [
                    "-ref", raw / "labelsTs", "-pred", predictions, "-o", work / "evaluation.json"], env)
                if (work / "evaluation.json").is_file():
                    summary = json.loads((work / "evaluation.json").read_text())
                    run.data["main_evaluation"] = {k: summary[k] for k in ("mean", "std") if k in summary}
        run.write()

    if "epochs" in args.parts:
        meddisseg = {"num_epochs": 3, "stage1_epochs": 1, "iterations_per_epoch": args.iterations,
                     "val_iterations_per_epoch": 2, "final_validation": False, "save_every": 1000}
        baseline = {"num_epochs": 2, "iterations_per_epoch": args.iterations, "val_iterations_per_epoch": 2,
                    "final_validation": False}
        for key, recipe in (("meddisseg", meddisseg), ("baseline", baseline)):
            (work / f"epochs_{key}.json").write_text(json.dumps(recipe))
        arms = [("meddisseg_fp16_eager", "nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans", {"nnUNet_compile": "f"}),
                ("meddisseg_bf16_eager", "nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans",
                 {"nnUNet_compile": "f", "nnUNet_meddisseg_bf16": "1"}),
                ("nnunet_fp16_eager", "nnUNetTrainerBaseline", "nnUNetPlans", {"nnUNet_compile": "f"}),
                ("meddisseg_bf16_compiled", "nnUNetTrainerMedDisSeg", "nnUNetMedDisSegPlans",
                 {"nnUNet_compile": "t", "nnUNet_meddisseg_bf16": "1"}),
                ("nnunet_fp16_compiled", "nnUNetTrainerBaseline", "nnUNetPlans", {"nnUNet_compile": "t"})]
        for label, trainer, plans, extra in arms:
            if run.left() < 60:
                run.data.setdefault("skipped", []).append(label)
                continue
            key = "meddisseg" if "MedDisSeg" in trainer else "baseline"
            arm_env = {**env, **extra, "nnUNet_meddisseg_recipe": str(work / f"epochs_{key}.json")}
            arm_results = work / "results_epochs" / label
            arm_env["nnUNet_results"] = str(arm_results)
            call = run.call(f"epochs_{label}", "nnUNetv2_train", [d, "2d", "0", "-tr", trainer, "-p", plans, "-device",
                                                                   args.device], arm_env)
            text = training_log(arm_results, trainer)
            times = epoch_times(text)
            figures: Dict[str, object] = {"all": times, "rc": call["rc"]}
            run.note_peak_memory(label, text)
            if key == "meddisseg" and len(times) >= 3:
                figures.update(meddisseg_stage1=times[0], meddisseg_stage2=times[2])
                if "compiled" in label:
                    run.data["compile_s"][f"{label}_stage2_first_epoch_minus_warm"] = round(times[1] - times[2], 1)
            elif key == "baseline" and len(times) >= 2:
                plans_file = json.loads((preprocessed / "nnUNetPlans.json").read_text())
                batch = plans_file["configurations"]["2d"]["batch_size"]
                figures.update(nnunet=times[1], nnunet_images_per_s=round(args.iterations * batch / times[1], 1))
            run.data["epoch_s"][label] = figures
            run.write()
    run.write()
    print(f"wrote {run.json_path} and {run.md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
