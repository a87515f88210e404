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
   ``--iterations``, the recipe in ``nnUNet_meddisseg_recipe``), ``nnUNetv2_predict`` of the test cases (without
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
under the trainer's regional compilation) and ``--steps onnx`` (``benchmarks/onnx_predict.py`` on the GPU:
nnU-Net's predictor against ONNX Runtime's TensorRT and CUDA providers, where the installed onnxruntime has them,
on generated ``--size`` images; its own ``onnx_predict.json`` / ``.md`` in OUT, the images/s in ``gpu_<device>``).

Files in OUT: ``gpu_<device>.json`` / ``.md`` (steps 1-2 and the targets), ``gpu_cli_<device>.json`` / ``.md``
(steps 3-4: the per-epoch table and the hours of the default schedules) and ``logs.tar.gz``. ``--device cpu``
rehearses every step on the CPU (small ``--size``, ``--cases`` and ``--iterations``; its figures mean nothing).

Time caps (seconds, :data:`CAPS`) on an H200, from what was measured there at 256x256: the Stage II step 101.5 ms
at batch 5 (39.5 images/s), inference 147 ms at batch 32; through ``nnUNetv2_train`` eager epochs of 50
iterations at batch 2 7.7 s warm, the first epoch of each stage 25-35 s longer; nnU-Net's default network 12.2 s,
then 1.9 s per epoch; compiling Stage I's training step 71 s:

- environment 45: Python and torch start 10, Triton builds the 4 CDFA kernels for 6 dtype / layout cases and
  TeLU for 3 dtypes (about 30 builds of about 0.7 s: 20 s), the checks a few seconds;
- eager 80: 3 networks or forms x (2 training figures x 13 steps x about 0.15 s at batch 5 + 2 inference figures x
  13 calls x <= 0.15 s) = 25 s, cuDNN's autotuning and building the networks 25 s, the profile 5 s, start 10 s;
- prepare 85 (convert 25, plan and preprocess 45, Med-DisSeg's plan 15): three commands of 10 s start each, the
  worker processes of fingerprinting and preprocessing starting (torch imported in each, 5-10 s per pool), 220
  cases converted and preprocessed by 8 processes;
- train compiled 250: the compile target of 180 s + 1 + 2 epochs of 250 images (6.3 s each at 39.5 images/s) and
  their warm-up, validation and final validation 20 s; predict 30, evaluate 15;
- train as decided (eager for so short a schedule) 130: start 15 + 3 epochs of 6.3 s + 2 x 30 s of warm-up +
  20 s of validation; predict 30, evaluate 15;
- nnU-Net's trainer eager 45 (start 15, 12 s first epoch, 5 s warm epoch at batch 10), compiled 90 (compiling
  the whole network about 50 s, an estimate);
- the optional step onnx 450, a command of its own after the environment step: the generated dataset, its
  planning and two untrained model folders (under a minute), the two exports with their checks on the CPU (11 s
  and 6 s at 128x128 on 2 CPU cores, several times that at 256x256), then 5-6 rounds of each predictor per
  mirroring setting on the GPU (seconds); TensorRT's engine builds (not measured, minutes per input shape) can
  take the rest.

Expected (not the caps): 30 + 55 + 45 + 270 + 155 + 30 + 65 = 650 s, over the 9 minutes. ``--budget-s``
(default 530) bounds the whole run: each command's cap is cut to what the budget leaves after the floors of the
steps after it (:data:`FLOORS`; a training of the main command also leaves its own prediction and evaluation
:data:`PREDICT_EVALUATE_FLOOR`), so that every step starts. The compiled main command, whose
``completed_through_predict`` and compile seconds are targets, goes first and gets its whole cap; where these
estimates hold, the decided run and nnU-Net's compiled training are cut short, which the results say.
"""
import argparse
import copy
import json
import os
import platform
import re
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from common import (
    NNUNET_ARCHITECTURES,
    block_profile,
    machine_info,
    make_batch,
    markdown_table,
    network_from_plans,
    package_version,
    stage2_loss,
    timed_ms,
)
from common import command_line as this_command

from nnunetv2_meddisseg.logged_command import run_logged_status

REPO = Path(__file__).resolve().parents[1]
DATASET_ID = 990
STEPS = ("environment", "eager", "main", "epochs")
#: seconds each command may run on an H200 (the module docstring gives the arithmetic)
CAPS = {"environment": 45, "eager": 80, "compiled": 240, "onnx": 450, "convert": 25, "plan_and_preprocess": 45,
        "meddisseg_plan": 15, "train_decided": 130, "train_forced": 250, "predict": 30, "evaluate": 15,
        "baseline_eager": 45, "baseline_compiled": 90, "meddisseg_eager": 130}
#: seconds each step is guaranteed (its cap is cut to leave these to the steps after it)
FLOORS = {"environment": 20, "eager": 40, "main": 240, "epochs": 40, "compiled": 60, "onnx": 120}
#: steps not in the default run, each a command of its own: ``--steps compiled`` / ``--steps onnx``
OPTIONAL_STEPS = ("compiled", "onnx")
#: seconds a training of the main command leaves to its own prediction and evaluation (at least what they need)
PREDICT_EVALUATE_FLOOR = (25, 10)
#: what a GPU user needs (images/s, seconds, GiB): (comparison, bound); the peak is the plans' memory target
TARGETS = {"train_eager": (">=", 60), "train_compiled": (">=", 110), "infer_b32_eager": (">=", 400),
           "infer_b32_compiled": (">=", 600), "infer_b4_fp32": (">=", 250), "bf16_over_fp32_training": (">", 1.0),
           "completed_through_predict": ("is", True), "compile_s_total": ("<=", 180), "peak_memory_gib": ("<=", 8.0)}
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
                path = self.files[name].with_suffix(suffix)
                path.with_name(path.name + ".partial").write_text(text)
                os.replace(path.with_name(path.name + ".partial"), path)
        archive = self.out / "logs.tar.gz"
        with tarfile.open(archive.with_name("logs.tar.gz.partial"), "w:gz") as tar:
            tar.add(self.logs, arcname="logs")
        os.replace(archive.with_name("logs.tar.gz.partial"), archive)


def console(name: str, args: Sequence[object]) -> List[str]:
    """``python -c`` calling the console command's entry point with ``args``."""
    module, function = ENTRY_POINTS[name].split(":")
    code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
    return ["python", "-c", code, *map(str, args)]


def write_split(target: Path, counts: Sequence[int]) -> dict:
    """A ``--split-file`` with the first TRAIN / VAL / TEST cases of the shipped Kvasir-SEG split."""
    shipped = json.loads((REPO / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json").read_text())
    split = {"description": "the first cases of each part of the shipped Kvasir-SEG split",
             **{key: shipped[key][:n] for key, n in zip(("train", "val", "test"), counts)}}
    target.write_text(json.dumps(split, indent=1) + "\n")
    return split


# ------------------------------------------------------------------------------------------------
# steps 1 and 2, each in a child process (``--step NAME``) that rewrites WORK/steps/NAME.json after every figure


class StepResults:
    """One child step's figures, rewritten to its JSON file after every ``put``."""

    def __init__(self, path: Path) -> None:
        self.path, self.data = path, {}
        path.parent.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, value) -> None:
        node = self.data
        *parents, leaf = key.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        self.path.with_name(self.path.name + ".partial").write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(self.path.with_name(self.path.name + ".partial"), self.path)
        print(f"{key}: {value if not isinstance(value, float) else round(value, 2)}", flush=True)


def environment_step(args, results: StepResults) -> None:
    import torch

    from nnunetv2_meddisseg.blocks.kernel_checks import run_checks

    device = torch.device(args.device)
    info = {**machine_info(args.device), "triton": package_version("triton"), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
            "kit_packages": {name: package_version(name) for name in (
                "nnunetv2", "dynamic_network_architectures", "batchgenerators", "batchgeneratorsv2", "acvl_utils",
                "nnunetv2_meddisseg", "SimpleITK", "blosc2", "timm")}}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 1024 ** 3, 1),
                    compute_capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    kit = REPO / ".gpu_kit" / "wheels"
    if kit.is_dir():
        info["kit_wheels"] = sorted(p.name for p in kit.glob("*.whl"))
    results.put("environment", info)
    run_checks(device, small=device.type == "cpu", compiled=args.compiled_check,
               report=lambda path, record: results.put(f"kernel_checks/{path}", record))


def build(name: str, deep_supervision: bool, size: int = 256):
    """``meddisseg`` (the default plans' MedDisSegNet) or ``nnunet`` (nnU-Net's default 2D network for 256x256,
    below that with as many stages as nnU-Net plans: the deepest 4x4), 3 -> 2 classes."""
    import torch

    from nnunetv2_meddisseg.plans_entry import architecture_entry

    torch.manual_seed(0)
    if name == "meddisseg":
        return network_from_plans(architecture_entry(), 3, 2, deep_supervision)
    entry = copy.deepcopy(NNUNET_ARCHITECTURES["PlainConvUNet"])
    kwargs = entry["arch_kwargs"]
    stages = min(kwargs["n_stages"], max(2, (size // 4).bit_length()))
    kwargs["n_stages"] = stages
    for key in ("features_per_stage", "kernel_sizes", "strides", "n_conv_per_stage"):
        kwargs[key] = kwargs[key][:stages]
    kwargs["n_conv_per_stage_decoder"] = kwargs["n_conv_per_stage_decoder"][:stages - 1]
    return network_from_plans(entry, 3, 2, deep_supervision)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``min(warmup, repeats)`` warm-up calls."""
    for _ in range(min(warmup, repeats)):
        fn()
    return statistics.median(timed_ms(fn) for _ in range(repeats))


def inference_call(net, batch: int, size: int, bf16: bool, device) -> Callable[[], object]:
    """Inference at ``batch``: fp32 NCHW, or bf16 autocast with the network and input channels-last."""
    import torch

    x = torch.randn(batch, 3, size, size, device=device)
    if bf16:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def run():
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return net(x)
    return run


def training_call(net, name: str, batch: int, size: int, bf16: bool, device) -> Callable[[], object]:
    """One training step (Adam, the trainers' clipped update): Stage II loss for Med-DisSeg, nnU-Net's
    deep-supervision Dice + CE for its network; fp32 NCHW, or bf16 autocast channels-last."""
    import torch

    from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step
    from nnunetv2_meddisseg.training.objectives import segmentation_loss

    net = net.to(memory_format=torch.channels_last) if bf16 else net
    x, target = make_batch(batch, size, device)
    x = x.contiguous(memory_format=torch.channels_last) if bf16 else x
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=device.type == "cuda")
    if name == "meddisseg":
        loss_fn = stage2_loss(dispersive=True)
    else:
        seg = segmentation_loss(batch_dice=True)
        with torch.no_grad():
            shapes = [o.shape[-2:] for o in net(x[:1])]
        targets = [torch.nn.functional.interpolate(target, size=s, mode="nearest") for s in shapes]

        def loss_fn(out, _target):
            return sum(seg(o, t) / 2 ** i for i, (o, t) in enumerate(zip(out, targets)))

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(net(x), target)
        backward_clip_step(loss, optimizer, None, net.parameters())
        return loss
    return step


def plan_batch(size: int, train_cases: int) -> int:
    """The batch ``nnUNetv2_meddisseg_plan`` gives ``train_cases`` cases at size x size (8 GiB target)."""
    from nnunetv2_meddisseg.planning.memory import batch_size_for_memory, estimated_memory_line

    return batch_size_for_memory(estimated_memory_line((size, size)), 8.0, max_batch_size=int(0.05 * train_cases))


def eager_step(args, results: StepResults) -> None:
    import torch

    from nnunetv2_meddisseg.blocks import device_forms
    from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available

    torch.backends.cudnn.benchmark = True
    device, size, big = torch.device(args.device), args.size, args.infer_batch
    cuda = device.type == "cuda"
    batch = args.batch or plan_batch(size, args.cases[0] + args.cases[1])
    results.put("settings", {"size": size, "train_batch": batch, "infer_batch": big, "repeats": args.repeats,
                             "memory_target_gib": 8.0, "cudnn_benchmark": True})

    def images_per_s(fn, n) -> float:
        return round(n * 1e3 / median_ms(fn, args.repeats), 2)

    def figures(prefix: str, name: str) -> None:
        net = build(name, False, size).to(device).eval()
        results.put(f"{prefix}/infer_b4_fp32", images_per_s(inference_call(net, 4, size, False, device), 4))
        results.put(f"{prefix}/infer_b{big}_bf16_channels_last",
                    images_per_s(inference_call(copy.deepcopy(net), big, size, True, device), big))
        del net
        for precision in ("fp32", "bf16"):
            net = build(name, True, size).to(device).train()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            step = training_call(net, name, batch, size, precision == "bf16", device)
            results.put(f"{prefix}/train_{precision}", images_per_s(step, batch))
            if cuda:
                results.put(f"{prefix}/peak_train_memory_gib_{precision}",
                            round(torch.cuda.max_memory_allocated() / 1024 ** 3, 2))
            del net, step

    fused = fused_cdfa_available(torch.empty(0, device=device))
    figures("meddisseg", "meddisseg")
    fused = fused and device_forms._fused_failure is None
    results.put("forms_default", "fused" if fused else "shifted")
    figures("nnunet", "nnunet")
    if fused:  # the CDFA forms side by side: the default (fused) run above, the shifted form here
        with device_forms.forced_form("shifted"):
            figures("meddisseg_shifted", "meddisseg")
        shifted = results.data["meddisseg_shifted"]
        results.put("fused_vs_shifted", {k: round(v / shifted[k], 2) for k, v in results.data["meddisseg"].items()
                                         if k in shifted and "memory" not in k})
    else:
        results.put("fused_vs_shifted", f"not measured: the fused form did not run here "
                                        f"({device_forms._fused_failure or 'it needs Triton and a CUDA device'})")
    net = build("meddisseg", False, size).to(device).eval()
    results.put("blocks", block_profile(net, inference_call(net, big, size, True, device)))
    from nnunetv2_meddisseg.blocks import telu_kernels

    results.put("fused_kernels_failed", {"cdfa": device_forms._fused_failure, "telu": telu_kernels._failure})


def compiled_step(args, results: StepResults) -> None:
    """Optional (not in the default steps): both networks under the trainer's regional compilation, the first
    call's seconds (compilation included) and the images/s after it."""
    import torch

    from nnunetv2_meddisseg.training.compilation import compile_regions

    torch.backends.cudnn.benchmark = True
    device, size, big = torch.device(args.device), args.size, args.infer_batch
    batch = args.batch or plan_batch(size, args.cases[0] + args.cases[1])
    for name in ("meddisseg", "nnunet"):
        net = build(name, False, size).to(device).eval()
        compile_regions(net)
        call = inference_call(net, big, size, True, device)
        results.put(f"{name}/compile_s_inference", round(timed_ms(call) / 1e3, 1))
        results.put(f"{name}/infer_b{big}_bf16_channels_last", round(big * 1e3 / median_ms(call, args.repeats), 2))
        net = build(name, True, size).to(device).train()
        compile_regions(net)
        step = training_call(net, name, batch, size, True, device)
        results.put(f"{name}/compile_s_training", round(timed_ms(step) / 1e3, 1))
        results.put(f"{name}/train_bf16", round(batch * 1e3 / median_ms(step, args.repeats), 2))


CHILD_STEPS = {"environment": environment_step, "eager": eager_step, "compiled": compiled_step}


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
# steps 3 and 4: nnU-Net's commands


def prepare_data(session: Session, env: Dict[str, str]) -> Optional[Path]:
    """Convert, plan and preprocess the Kvasir-SEG subset, and Med-DisSeg's plans: the preprocessed folder, None
    where a command failed."""
    from nnunetv2_meddisseg.environment import planning_environment

    args, work = session.args, session.work
    d, processes = str(DATASET_ID), str(min(8, os.cpu_count() or 1))
    split = write_split(work / "split.json", args.cases)
    session.cli.update(cases={k: len(v) for k, v in split.items() if isinstance(v, list)}, size=args.size,
                       iterations_per_epoch=args.iterations)
    commands = [("convert", "nnUNetv2_meddisseg_convert", ["kvasir-seg", args.kvasir, "-d", d, "--resize", args.size,
                                                           "--split-file", work / "split.json", "--overwrite", "-np",
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
    preprocessed = next(Path(env["nnUNet_preprocessed"]).glob(f"Dataset{DATASET_ID}_*"))
    session.cli["plans"] = {}
    for plans in ("nnUNetMedDisSegPlans", "nnUNetPlans"):
        config = json.loads((preprocessed / f"{plans}.json").read_text())["configurations"]["2d"]
        session.cli["plans"][plans] = {"batch_size": config["batch_size"], "patch_size": config["patch_size"],
                                       "batch_size_source": config.get("batch_size_source")}
    return preprocessed


def train(session: Session, label: str, trainer: str, plans: str, env: Dict[str, str], recipe: dict, key: str,
          step: str, reserve_s: float = 0.0) -> Tuple[dict, Path]:
    """``nnUNetv2_train`` with ``recipe`` (``nnUNet_meddisseg_recipe``) and its own results folder: the figures of
    its log and that folder."""
    work = session.work
    (work / f"recipe_{label}.json").write_text(json.dumps(recipe))
    results = work / f"results_{label}"
    run_env = {**env, "nnUNet_meddisseg_recipe": str(work / f"recipe_{label}.json"), "nnUNet_results": str(results)}
    record = session.call(f"{label}_train", console("nnUNetv2_train", [DATASET_ID, "2d", "0", "-tr", trainer, "-p",
                                                                       plans, "-device", session.args.device]),
                          run_env, key, step, reserve_s)
    session.cli["commands"].append(record)
    text = training_log(results, trainer)
    batch = session.cli.get("plans", {}).get(plans, {}).get("batch_size")
    times = epoch_times(text)
    figures = {"trainer": trainer, "plans": plans, "batch_size": batch, "rc": record["rc"],
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


def main_step(session: Session) -> None:
    """Step 3: prepare, then the main command with torch.compile forced on, then as the trainer decides."""
    from nnunetv2_meddisseg.environment import nnunet_environment

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
            "-p", plans, "-device", args.device]), env_results, "predict", "main", evaluate_floor)
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


def epochs_step(session: Session) -> None:
    """Step 4: nnU-Net's default trainer, 2 epochs eager and compiled (and Med-DisSeg eager where step 3 has no
    eager run); the hours of the default schedules."""
    from nnunetv2_meddisseg.environment import nnunet_environment

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


def onnx_step(session: Session) -> None:
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


# ------------------------------------------------------------------------------------------------
# results as markdown


def _cell(value) -> str:
    return "-" if value is None else str(value)


def gpu_markdown(data: dict) -> str:
    env = data.get("environment", {})
    lines = [f"# Med-DisSeg on {data['device']}: environment, kernel checks, eager figures", "",
             f"{env.get('date', '-')}; {env.get('gpu', env.get('cpu', '-'))}, {env.get('cpu_cores', '-')} CPU cores; "
             f"torch {env.get('torch', '-')}, Triton {env.get('triton', '-')}, CUDA {env.get('cuda', '-')}, "
             f"Python {env.get('python', '-')}, nnunetv2 {env.get('nnunetv2', '-')}; `{data['command']}`", ""]
    checks = [[f"{kernel}/{name}", r.get("skipped") or r.get("error")
               or f"{max(r['errors'].values()):.1e} (tolerance {r['tolerance']:.0e})",
               {True: "passed", False: "FAILED"}.get(r.get("passed"), "skipped")]
              for kernel, named in data.get("kernel_checks", {}).items() for name, r in named.items()]
    if checks:
        lines += [markdown_table(["kernel check", "largest relative error", ""], checks), ""]
    settings = data.get("settings", {})
    if settings:
        big = settings["infer_batch"]
        keys = ["train_fp32", "train_bf16", "infer_b4_fp32", f"infer_b{big}_bf16_channels_last",
                "peak_train_memory_gib_fp32", "peak_train_memory_gib_bf16"]
        columns = [c for c in ("meddisseg", "meddisseg_shifted", "nnunet") if c in data]
        titles = {"meddisseg": f"Med-DisSeg ({data.get('forms_default', '?')} CDFA)",
                  "meddisseg_shifted": "Med-DisSeg (shifted CDFA)", "nnunet": "nnU-Net's default network"}
        rows = [[k.replace("_", " ")] + [_cell(data[c].get(k)) for c in columns] for k in keys]
        lines += [f"Eager, {settings['size']}x{settings['size']}, training batch {settings['train_batch']} (the "
                  f"plan's), images/s (memory in GiB), medians of {settings['repeats']} calls:", "",
                  markdown_table(["figure"] + [titles[c] for c in columns], rows), ""]
        if isinstance(data.get("fused_vs_shifted"), dict):
            lines += ["Fused vs shifted CDFA form, same run: "
                      + ", ".join(f"{k} x{v}" for k, v in data["fused_vs_shifted"].items()), ""]
        elif data.get("fused_vs_shifted"):
            lines += [f"CDFA forms: {data['fused_vs_shifted']}", ""]
    blocks = data.get("blocks")
    if blocks:
        lines += [f"Batch-{settings.get('infer_batch')} bf16 inference: wall {blocks['wall_ms']} ms, summed kernel "
                  f"time {blocks['kernel_ms']} ms.", "",
                  markdown_table(["block", "ms"], list(blocks["per_block_ms"].items())), "",
                  markdown_table(["kernel", "calls", "self ms"],
                                 [[f"`{k['name'][:90]}`", k["calls"], k["ms"]] for k in blocks["top_kernels"]]), ""]
    lines += onnx_markdown(data.get("onnx"))
    targets = [[k, t["target"], _cell(t["measured"]), {True: "met", False: "MISSED", None: "not measured"}[t["met"]],
                t["source"]] for k, t in data.get("targets", {}).items()]
    if targets:
        lines += [markdown_table(["target", "", "measured", "", "from"], targets), ""]
    steps = [[name, s["rc"], s["seconds"], s["cap_s"]] for name, s in data["steps"].items()]
    lines.append(markdown_table(["step", "rc", "seconds", "cap"], steps))
    return "\n".join(lines) + "\n"


def onnx_markdown(onnx: Optional[dict]) -> List[str]:
    """Step onnx's lines: images/s of nnU-Net's predictor and of each ONNX Runtime provider, and their masks'
    agreement (``onnx_predict.md`` has the rest)."""
    if not onnx:
        return []
    lines = [f"ONNX Runtime {onnx.get('onnxruntime', '-')} (providers here: "
             f"{', '.join(onnx['providers_available'])}) against nnU-Net's predictor, {onnx['cases']} images:", ""]
    results, rows = onnx["results"], []
    for key, figures in results.items():
        parts = key.split(" / ")  # model / arm / mode, and " / agreement" after the ONNX arms' agreement
        if len(parts) != 3 or parts[1] == "nnUNetv2_predict":
            continue
        name, arm, mode = parts
        torch_figures, agreement = results[f"{name} / nnUNetv2_predict / {mode}"], results[f"{key} / agreement"]
        rows.append([name, mode, arm, round(torch_figures["images_per_s"], 2), round(figures["images_per_s"], 2),
                     f"{figures['images_per_s'] / torch_figures['images_per_s']:.2f}x",
                     agreement["sessions_and_first_round_s"], f"{agreement['min_dice']:.4f}"])
    if rows:
        lines += [markdown_table(["model", "mirroring", "provider", "nnU-Net's predictor images/s",
                                  "ONNX Runtime images/s", "ratio", "sessions + first round s", "min Dice"], rows), ""]
    failed = [f"{key[:-len(' / agreement')]}: {record['error']}" for key, record in results.items()
              if key.endswith(" / agreement") and "error" in record]
    notes = [f"Left out: {p} {why}" for p, why in onnx["providers_left_out"].items()] + failed
    return lines + notes + ([""] if notes else [])


def cli_markdown(data: dict) -> str:
    lines = [f"# nnU-Net's commands with Med-DisSeg on {data['device']}", "", f"`{data['command']}`", "",
             f"Compiled `nnUNetv2_train` through `nnUNetv2_predict`: **{data['completed_through_predict']}**"
             + (f"; compile seconds in total {data['compile_s_total']}" if data.get("compile_s_total") else ""), ""]
    if data.get("cases"):
        plans = "; ".join(f"{k} batch {v['batch_size']}" for k, v in data.get("plans", {}).items())
        lines += [f"{data['cases']['train']} training / {data['cases']['val']} validation / {data['cases']['test']} "
                  f"test cases at {data['size']}x{data['size']}, epochs of {data['iterations_per_epoch']} "
                  f"iterations; {plans}.", ""]
    main = data.get("main", {})
    if main:
        rows = [[arm, f["nnUNet_compile"], f"{f['decision']} ({f['reason']})" if f["decision"] else "-",
                 ", ".join(f"{g} {s}" for g, s in (f["compile_s"] or {}).items()) or "-",
                 ", ".join(map(str, f["epoch_s"])) or "-", f.get("predicted_cases", "-"),
                 _cell((f.get("test_mean") or {}).get("dice"))] for arm, f in main.items()]
        lines += [markdown_table(["main command", "nnUNet_compile", "decision", "compile s per graph", "epoch s",
                                  "predicted", "test Dice"], rows), ""]
    epochs = {k: v for k, v in data.get("epochs", {}).items() if isinstance(v, dict)}
    if epochs:
        hours = data.get("default_schedule_hours", {})
        rows = []
        for key, f in epochs.items():
            warm = f.get("stage2_warm_epoch") or f.get("warm_epoch") or {}
            first = f.get("stage1_epoch") or {}
            rows.append([key, {True: "yes", False: "no"}.get(f.get("compiled"), "-"), _cell(first.get("seconds")),
                         _cell(warm.get("seconds")), _cell(warm.get("images_per_s")), _cell(hours.get(key))])
        lines += [markdown_table(["trainer", "compiled (its log)", "Stage I epoch s (first)", "warm epoch s",
                                  "training images/s", "hours, default schedule"], rows), ""]
    commands = [[c["label"], c["rc"], c["seconds"], c["cap_s"]] for c in data["commands"]]
    lines.append(markdown_table(["command", "rc", "seconds", "cap"], commands))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# the command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = os.environ.get("NNUNETV2_MEDDISSEG_TEST_DATA")
    p.add_argument("--session", type=Path, metavar="OUT", help="folder for the results files and the logs' archive")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a rehearsal of every step")
    p.add_argument("--steps", nargs="+", choices=STEPS + OPTIONAL_STEPS, default=list(STEPS),
                   help="steps to run, in this order; not in the default: 'compiled' (the networks under the "
                        "trainer's regional compilation) and 'onnx' (ONNX Runtime's GPU providers against nnU-Net's "
                        "predictor)")
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
