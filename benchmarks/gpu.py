"""Everything a GPU user needs to know about Med-DisSeg on one CUDA GPU, in one command of under 9 minutes.

``python benchmarks/gpu.py --session OUT`` runs these steps in order, each in subprocesses with their own time
caps (a command still running at its cap is stopped with its child processes), and rewrites the results in OUT
after every step (a kill leaves what finished):

1. ``environment``: torch, Triton, CUDA, the GPU, the versions of the packages nnU-Net needs, and the accuracy
   checks of the fused kernels (CDFA, TeLU, ``instance_norm_channels_last``) against their reference forms
   (``nnunetv2_meddisseg.blocks.kernel_checks``, no pytest needed);
2. ``eager``: 256x256, both networks (Med-DisSeg and nnU-Net's default 2D network), eager: the Stage II training
   step at the plan's batch in fp32 and bf16 (channels-last), inference at batch 4 fp32 and batch 32 bf16
   channels-last, peak memory; Med-DisSeg's CDFA forms side by side (the fused form, what CUDA runs, and the
   shifted form) in the same process, and a per-block profile of the batch-32 inference;
3. ``main``: the main command as users type it, on the first TRAIN / VAL / TEST cases of the shipped Kvasir-SEG
   split: ``nnUNetv2_meddisseg_convert``, ``nnUNetv2_plan_and_preprocess``, ``nnUNetv2_meddisseg_plan``, then
   twice -- torch.compile forced on (``nnUNet_compile=t``) first, then as the trainer decides (``nnUNet_compile``
   unset) -- ``nnUNetv2_train -tr nnUNetTrainerMedDisSeg`` through both stages (1 Stage I + 2 Stage II epochs of
   ``--iterations``, the recipe in a copy of the plans), ``nnUNetv2_predict`` of the test cases (without
   ``nnUNet_compile``, with which nnU-Net's predictor compiles the network as well) and
   ``nnUNetv2_meddisseg_evaluate``. The trainer's decision line (``torch.compile: on|off (<reason>)``) and the
   seconds of each compiled graph (``torch.compile: graph "<name>" compiled in <s> s``) are read from the training
   log (null where absent); ``completed_through_predict`` is true when the compiled training's prediction wrote
   every test case. These runs also give Med-DisSeg's seconds per epoch (the second Stage II epoch is warm);
4. ``epochs``: nnU-Net's default trainer (``nnUNetTrainerBaseline``) through ``nnUNetv2_train``, eager and
   compiled, 2 epochs of ``--iterations`` (the second is warm), on the same data; Med-DisSeg eager as well where
   step 3 has no eager run. With >= 200 training cases nnU-Net's rule that a batch covers at most 5 % of the data
   no longer caps the plans' batches at 2 (as on a 40-case subset): nnU-Net's network gets up to 10, Med-DisSeg
   the batch of its 8 GiB target (5 estimated on the CPU, 6 measured on an H200).

Two steps are not in the default run, each meant as a command of its own: ``--steps compiled`` (both networks
compiled as the trainer compiles them) and ``--steps onnx`` (``benchmarks/onnx_predict.py`` on the GPU:
nnU-Net's predictor against ONNX Runtime's TensorRT and CUDA providers, where the installed onnxruntime has them,
on generated ``--size`` images; its own ``onnx_predict.json`` / ``.md`` in OUT, the images/s in ``gpu_<device>``).

The steps live in ``gpu_networks`` (1, 2 and ``compiled``, each in a child process) and ``gpu_commands`` (3, 4 and
``onnx``), the results files' markdown in ``gpu_report``. Files in OUT: ``gpu_<device>.json`` / ``.md`` (steps 1-2
and the targets), ``gpu_cli_<device>.json`` / ``.md`` (steps 3-4: the per-epoch table and the hours of the default
schedules) and ``logs.tar.gz``. ``--device cpu`` rehearses every step on the CPU (small ``--size``, ``--cases`` and
``--iterations``; its figures mean nothing).

Time caps (seconds, :data:`CAPS`): from what was measured on an H200 at 256x256 (``benchmarks/README.md``, "On a
GPU", gives the arithmetic of each). Expected (not the caps): 30 + 55 + 45 + 270 + 155 + 30 + 65 = 650 s, over the
9 minutes. ``--budget-s`` (default 530) bounds the whole run: each command's cap is cut to what the budget leaves
after the floors of the steps after it (:data:`FLOORS`; a training of the main command also leaves its own
prediction and evaluation ``gpu_commands.PREDICT_EVALUATE_FLOOR``), so that every step starts. The compiled main
command, whose ``completed_through_predict`` and compile seconds are targets, goes first and gets its whole cap;
where these estimates hold, the decided run and nnU-Net's compiled training are cut short, which the results say.
"""
import argparse
import json
import os
import platform
import re
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from common import command_line as this_command
from gpu_commands import epochs_step, main_step, onnx_step
from gpu_networks import CHILD_STEPS, StepResults
from gpu_report import cli_markdown, gpu_markdown

from nnunetv2_meddisseg.files import write_atomically
from nnunetv2_meddisseg.logged_command import run_logged_status

REPO = Path(__file__).resolve().parents[1]
STEPS = ("environment", "eager", "main", "epochs")
#: seconds each command may run on an H200 (benchmarks/README.md, "On a GPU", gives the arithmetic)
CAPS = {"environment": 45, "eager": 80, "compiled": 240, "onnx": 450, "convert": 25, "plan_and_preprocess": 45,
        "meddisseg_plan": 15, "train_decided": 130, "train_forced": 250, "predict": 30, "evaluate": 15,
        "baseline_eager": 45, "baseline_compiled": 90, "meddisseg_eager": 130}
#: seconds each step is guaranteed (its cap is cut to leave these to the steps after it)
FLOORS = {"environment": 20, "eager": 40, "main": 240, "epochs": 40, "compiled": 60, "onnx": 120}
#: steps not in the default run, each a command of its own: ``--steps compiled`` / ``--steps onnx``
OPTIONAL_STEPS = ("compiled", "onnx")
#: what a GPU user needs (images/s, seconds, GiB): (comparison, bound); the peak is the plans' memory target
TARGETS = {"train_eager": (">=", 60), "train_compiled": (">=", 110), "infer_b32_eager": (">=", 400),
           "infer_b32_compiled": (">=", 600), "infer_b4_fp32": (">=", 250), "bf16_over_fp32_training": (">", 1.0),
           "completed_through_predict": ("is", True), "compile_s_total": ("<=", 180), "peak_memory_gib": ("<=", 8.0)}


# ------------------------------------------------------------------------------------------------
# the session: steps, caps, results


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


class Session:
    """The run's deadline, its commands (each logged under WORK/logs with its cap) and the two results files,
    rewritten after every command."""

    def __init__(self, args, device_name: str) -> None:
        self.args, self.out, self.work = args, Path(args.session), Path(args.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        slug = device_slug(device_name)
        self.files = {"gpu": self.out / f"gpu_{slug}", "gpu_cli": self.out / f"gpu_cli_{slug}"}
        head = {"device": device_name, "command": this_command(), "budget_s": args.budget_s}
        self.gpu = {**head, "steps": {}}
        self.cli = {**head, "commands": [], "completed_through_predict": None}  # None: step main did not run

    def cap(self, key: str, step: str, reserve_s: float = 0.0) -> float:
        """``key``'s cap, cut to the budget left after the floors of the steps after ``step`` and ``reserve_s`` (for
        the commands after it in the same step)."""
        later = sum(FLOORS[s] for s in self.args.steps[self.args.steps.index(step) + 1:])
        return min(CAPS[key] * self.args.cap_scale, self.deadline - time.monotonic() - later - reserve_s)

    def call(self, label: str, command: Sequence[str], env: Dict[str, str], key: str, step: str,
             reserve_s: float = 0.0) -> dict:
        """Run ``command`` (logged to ``logs/<label>.log``) within its cap: ``{"label", "rc", "seconds", "cap_s"}``,
        rc ``"stopped at its cap"`` when it was stopped, ``"not started"`` when the budget had no time left."""
        cap = self.cap(key, step, reserve_s)
        record = {"label": label, "cap_s": round(max(cap, 0.0), 1)}
        if cap < 5:
            record.update(rc="not started (time budget)", seconds=0.0)
        else:
            rc, seconds = run_logged_status(command, env, self.logs / f"{label}.log", echo=False, timeout_s=cap)
            record.update(rc="stopped at its cap" if rc is None else rc, seconds=round(seconds, 1))
        print(f"{label}: rc {record['rc']} in {record['seconds']} s (cap {record['cap_s']} s)", flush=True)
        return record

    def targets(self) -> Dict[str, dict]:
        """Each target of :data:`TARGETS` with the figure measured for it (None: not measured) and whether it is
        met."""
        gpu, cli = self.gpu, self.cli
        med, compiled = gpu.get("meddisseg", {}), gpu.get("compiled", {}).get("meddisseg", {})
        big = gpu.get("settings", {}).get("infer_batch", 32)
        forced = (cli.get("main", {}).get("forced") or {}).get("stage2_warm_epoch") or {}
        trained = [v for v in (med.get("train_fp32"), med.get("train_bf16")) if v is not None]
        memory = [v for v in (med.get("peak_train_memory_gib_fp32"), med.get("peak_train_memory_gib_bf16"),
                              *(f.get("peak_memory_gib") for f in cli.get("main", {}).values())) if v is not None]
        measured = {
            "train_eager": (max(trained) if trained else None, "step eager, the faster of fp32 / bf16"),
            "train_compiled": (compiled.get("train_bf16"), "step compiled") if compiled.get("train_bf16") else
            (forced.get("images_per_s"), "warm Stage II epoch of the compiled main command (data loading and "
                                         "validation included)"),
            "infer_b32_eager": (med.get(f"infer_b{big}_bf16_channels_last"), "step eager"),
            "infer_b32_compiled": (compiled.get(f"infer_b{big}_bf16_channels_last"), "step compiled"),
            "infer_b4_fp32": (med.get("infer_b4_fp32"), "step eager"),
            "bf16_over_fp32_training": (round(med["train_bf16"] / med["train_fp32"], 2)
                                        if med.get("train_fp32") and med.get("train_bf16") else None, "step eager"),
            "completed_through_predict": (cli.get("completed_through_predict"), "step main"),
            "compile_s_total": (cli.get("compile_s_total"), "step main, the compiled training's log"),
            "peak_memory_gib": (max(memory) if memory else None, "steps eager and main"),
        }
        result = {}
        for key, (compare, bound) in TARGETS.items():
            value, source = measured[key]
            met = None if value is None else (value is bound if compare == "is" else
                                              value >= bound if compare == ">=" else
                                              value > bound if compare == ">" else value <= bound)
            result[key] = {"target": f"{compare} {bound}", "measured": value, "met": met, "source": source}
        return result

    def write(self) -> None:
        """Both results files (JSON and markdown, each replaced whole) and the logs' archive."""
        self.gpu["targets"] = self.targets()
        for name, data, render in (("gpu", self.gpu, gpu_markdown), ("gpu_cli", self.cli, cli_markdown)):
            for suffix, text in ((".json", json.dumps(data, indent=1, default=str) + "\n"), (".md", render(data))):
                write_atomically(self.files[name].with_suffix(suffix), lambda partial: partial.write_text(text))

        def archive(partial: Path) -> None:
            with tarfile.open(partial, "w:gz") as tar:
                tar.add(self.logs, arcname="logs")
        write_atomically(self.out / "logs.tar.gz", archive)


def run_child_step(session: Session, step: str) -> None:
    """Step ``step`` in a child process (``--step``) within its cap; its figures go to ``gpu_<device>.json``."""
    args = session.args
    results = session.work / "steps" / f"{step}.json"
    results.unlink(missing_ok=True)
    command = ["python", str(Path(__file__).resolve()), "--step", step, "--work", str(session.work),
               "--device", args.device, "--size", str(args.size), "--batch", str(args.batch), "--repeats",
               str(args.repeats), "--infer-batch", str(args.infer_batch), "--cases", *map(str, args.cases)]
    command += ["--compiled-check"] if args.compiled_check else []
    env = dict(os.environ)
    if args.device == "cpu" and step == "environment":
        env["TRITON_INTERPRET"] = "1"  # the Triton kernels through Triton's interpreter (before its first import)
    record = session.call(step, command, env, step, step)
    figures = json.loads(results.read_text()) if results.is_file() else {}
    if step == "compiled":
        session.gpu["compiled"] = figures
    else:
        session.gpu.update(figures)
    session.gpu["steps"][step] = {k: v for k, v in record.items() if k != "label"}
    session.write()


# ------------------------------------------------------------------------------------------------
# the command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = os.environ.get("NNUNETV2_MEDDISSEG_TEST_DATA")
    p.add_argument("--session", type=Path, metavar="OUT", help="folder for the results files and the logs' archive")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a rehearsal of every step")
    p.add_argument("--steps", nargs="+", choices=STEPS + OPTIONAL_STEPS, default=list(STEPS),
                   help="steps to run, in this order; not in the default: 'compiled' (the networks compiled as the "
                        "trainer compiles them) and 'onnx' (ONNX Runtime's GPU providers against nnU-Net's predictor)")
    p.add_argument("--kvasir", type=Path, default=Path(data) / "Kvasir-SEG" if data else None,
                   help="Kvasir-SEG folder (images/, masks/); default $NNUNETV2_MEDDISSEG_TEST_DATA/Kvasir-SEG")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--cases", type=int, nargs=3, default=(200, 10, 10), metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--iterations", type=int, default=50, help="training iterations per epoch")
    p.add_argument("--val-iterations", type=int, default=2, help="validation iterations per epoch")
    p.add_argument("--batch", type=int, default=0, help="training batch of step eager; 0: the plan's")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per figure of step eager")
    p.add_argument("--infer-batch", type=int, default=32)
    p.add_argument("--main-arms", nargs="+", choices=("decided", "forced"), default=["decided", "forced"],
                   help="the main command with torch.compile as the trainer decides, and forced on")
    p.add_argument("--epoch-arms", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"],
                   help="nnU-Net's default trainer in step epochs")
    p.add_argument("--compiled-check", action="store_true",
                   help="step environment also checks the CDFA block under torch.compile (10-20 s more)")
    p.add_argument("--budget-s", type=float, default=530.0, help="seconds for the whole run")
    p.add_argument("--cap-scale", type=float, default=1.0, help="multiplies every command's cap (slow machines)")
    p.add_argument("--work", type=Path, default=None, help="folder for nnU-Net's folders and the logs "
                                                           "(default: a new temporary folder)")
    p.add_argument("--step", choices=tuple(CHILD_STEPS), help=argparse.SUPPRESS)  # a child process's step
    return p


def check_args(p: argparse.ArgumentParser, args) -> None:
    if args.step:
        return
    if args.session is None:
        p.error("--session OUT is required (the folder for the results files)")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu rehearses "
                    "the steps on the CPU")
    if "main" in args.steps and (args.kvasir is None or not (args.kvasir / "images").is_dir()):
        p.error(f"--kvasir {args.kvasir}: expected a Kvasir-SEG folder with images/ and masks/ (or set "
                f"NNUNETV2_MEDDISSEG_TEST_DATA to the folder holding Kvasir-SEG/)")
    if args.size < 32 or args.size % 32:
        p.error(f"--size must be a multiple of 32, got {args.size}")
    if min(args.cases) < 1 or args.cases[0] < 2 or min(args.iterations, args.val_iterations, args.repeats) < 1:
        p.error("--cases needs at least 2 training cases and 1 of the others; --iterations, --val-iterations and "
                "--repeats at least 1")
    if not (args.budget_s > 0 and args.cap_scale > 0):
        p.error("--budget-s and --cap-scale must be above 0")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    if args.step:
        CHILD_STEPS[args.step](args, StepResults(args.work / "steps" / f"{args.step}.json"))
        return 0
    args.steps = [s for s in STEPS + OPTIONAL_STEPS if s in args.steps]
    args.work = (args.work or Path(tempfile.mkdtemp(prefix="meddisseg_gpu_"))).resolve()
    import torch

    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.machine()})"
    session = Session(args, name)
    print(f"results: {session.files['gpu']}.json, {session.files['gpu_cli']}.json; work folder (kept): {args.work}",
          flush=True)
    start = time.monotonic()
    for step in args.steps:
        if step in CHILD_STEPS:
            run_child_step(session, step)
        elif step == "main":
            main_step(session)
        elif step == "onnx":
            onnx_step(session)
        else:
            epochs_step(session)
    session.gpu["total_s"] = session.cli["total_s"] = round(time.monotonic() - start, 1)
    session.write()
    print(session.files["gpu"].with_suffix(".md").read_text())
    print(session.files["gpu_cli"].with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
