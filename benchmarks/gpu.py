"""Med-DisSeg and nnU-Net's network on one CUDA GPU: throughput, per-block time, top kernels, compile time.

``python benchmarks/gpu.py [--size 256] [--batch 0] [--repeats 20] [--budget-s 600] [--parts eager compiled] [--out DIR]``

(``--device cpu --size 128 --batch 2 --infer-batch 2 --repeats 1`` rehearses every part on the CPU: its figures mean
nothing.)

Measured in one process, side by side, with ``torch.backends.cudnn.benchmark = True`` as nnU-Net sets it:

1. ``train_images_per_s``: one Stage II training step of the default plans' network (``nnUNetv2_meddisseg_plan``
   defaults: InstanceNorm in the added blocks) at the plan's batch (``--batch`` 0) with the trainer's Stage II loss
   (dispersive term included) and Adam (fused on CUDA): ``eager`` and ``compiled`` (the trainer's regional
   compilation), under bf16 autocast with channels-last tensors where the GPU supports bf16, else fp16
   autocast with a GradScaler (what training uses).
2. ``infer_images_per_s``: inference forwards at batch 4 in fp32 (``b4_fp32``) and batch 32 under bf16 autocast
   with channels-last tensors, eager and compiled; the same keys for nnU-Net's default 2D network
   (``nnunet_infer_images_per_s``, ``nnunet_train_images_per_s``).
3. ``forms``: the same eager figures for each implementation form of the aggregation block
   (``blocks.device_forms``), so that a change of form is measured against the other in the same run.
4. ``blocks``: per-block CUDA time of one batch-32 bf16 inference forward (``torch.profiler``, with a
   ``record_function`` range pushed by forward hooks around every top-level block), the forward's wall time
   against its summed kernel time, and the 20 kernels with the most self time.
5. ``compile_s``: seconds of each compilation's first call (tracing and code generation included).

Each figure is the median of ``--repeats`` timed calls (CUDA events) after warm-up. Parts that the time left
(``--budget-s``) cannot hold are skipped and say so; the results are rewritten after every part, to
``OUT/gpu_<device>.json`` and ``.md``.
"""
import argparse
import contextlib
import copy
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
TOP_KERNELS = 20
#: nnU-Net 2.8's ``nnUNetPlans`` 2d architecture for a 256x256 RGB dataset (ExperimentPlanner)
NNUNET_2D = {
    "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "arch_kwargs": {"n_stages": 7, "features_per_stage": [32, 64, 128, 256, 512, 512, 512],
                    "conv_op": "torch.nn.modules.conv.Conv2d", "kernel_sizes": [[3, 3]] * 7,
                    "strides": [[1, 1]] + [[2, 2]] * 6, "n_conv_per_stage": [2] * 7, "n_conv_per_stage_decoder": [2] * 6,
                    "conv_bias": True, "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
                    "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
                    "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
    "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
}


def build(name: str, deep_supervision: bool) -> nn.Module:
    """``meddisseg`` (the default plans' MedDisSegNet) or ``nnunet`` (nnU-Net's default 2D network), 3 -> 2 classes."""
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
    from nnunetv2_meddisseg.plans_entry import architecture_entry

    entry = architecture_entry() if name == "meddisseg" else NNUNET_2D
    torch.manual_seed(0)
    return get_network_from_plans(entry["network_class_name"], dict(entry["arch_kwargs"]), entry["_kw_requires_import"],
                                  3, 2, allow_init=True, deep_supervision=deep_supervision)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn: Callable[[], object]) -> float:
    """Milliseconds of one ``fn()``: CUDA events on a GPU, the host clock elsewhere."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``min(warmup, repeats)`` warm-up calls."""
    for _ in range(min(warmup, repeats)):
        fn()
    synchronize()
    return statistics.median(timed_ms(fn) for _ in range(repeats))


def first_call_s(fn: Callable[[], object]) -> float:
    """Seconds of the first call (compilation included), synchronised."""
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def precision(device: torch.device) -> str:
    """``bf16`` where the GPU supports it (training and prediction use bf16 + channels-last there), else ``fp16``."""
    return "bf16" if device.type != "cuda" or torch.cuda.is_bf16_supported() else "fp16"


def inference_call(net: nn.Module, batch: int, size: int, amp: Optional[torch.dtype], channels_last: bool,
                   device: torch.device) -> Callable[[], object]:
    x = torch.randn(batch, 3, size, size, device=device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def run():
        with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            return net(x)
    return run


def training_call(net: nn.Module, name: str, batch: int, size: int, amp: torch.dtype,
                  device: torch.device) -> Callable[[], object]:
    """One training step: Stage II loss for Med-DisSeg, nnU-Net's deep-supervision Dice + CE for its network."""
    from nnunetv2_meddisseg.training.stage2_loss import Stage2Weights, dispersive_from_recipe, segmentation_loss, stage2_loss
    from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step
    from nnunetv2_meddisseg.training.recipes import RECIPES

    channels_last = amp == torch.bfloat16
    net = net.to(memory_format=torch.channels_last) if channels_last else net
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g).to(device)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    target = (torch.rand(batch, 1, size, size, generator=g) > 0.7).float().to(device)
    seg = segmentation_loss(batch_dice=True)
    recipe = RECIPES["MedDisSeg"]
    dispersive, weights = dispersive_from_recipe(recipe), Stage2Weights.from_recipe(recipe)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
    targets = None
    if name == "nnunet":
        with torch.no_grad():
            shapes = [o.shape[-2:] for o in net(x[:1])]
        targets = [torch.nn.functional.interpolate(target, size=s, mode="nearest") for s in shapes]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp):
            out = net(x)
            if name == "meddisseg":
                loss = stage2_loss(out, target, seg, dispersive, weights)[0]
            else:
                loss = sum(seg(o, t) / 2 ** i for i, (o, t) in enumerate(zip(out, targets)))
        backward_clip_step(loss, optimizer, scaler, net.parameters())  # the trainers' update, clipping at 12
        return loss
    return step


class Report:
    """The results dict, rewritten to JSON and markdown after every part."""

    def __init__(self, out: Path, budget_s: float, device: torch.device, keep: bool = False) -> None:
        device_name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.machine()})"
        name = re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")
        self.json_path, self.md_path = out / f"gpu_{name}.json", out / f"gpu_{name}.md"
        self.deadline = time.monotonic() + budget_s
        try:
            import triton
            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        previous = json.loads(self.json_path.read_text()) if self.json_path.is_file() else {}
        self.data: Dict[str, object] = previous if previous.get("device") == device_name and keep else {}
        earlier = self.data.get("command")
        self.data.update({
            "device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "triton": triton_version,
            "python": platform.python_version(), "command": " ".join(["python", *sys.argv]),
            "cudnn_benchmark": True})
        if earlier:  # this run adds to an earlier one's results
            self.data["command"] = f"{earlier}; {self.data['command']}"
        self.data.setdefault("skipped", {})

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def put(self, path: str, value) -> None:
        node = self.data
        *parents, leaf = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        print(f"{path}: {value if not isinstance(value, float) else round(value, 2)}", flush=True)

    def skip(self, part: str, why: str) -> None:
        self.data["skipped"][part] = why
        print(f"skipped {part}: {why}", flush=True)

    def write(self) -> None:
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps(self.data, indent=1) + "\n")
        self.md_path.write_text(markdown(self.data))


def markdown(data: dict) -> str:
    lines = [f"# GPU benchmark: {data['device']}", "",
             f"torch {data['torch']} (CUDA {data['cuda']}, cuDNN {data['cudnn']}), triton {data['triton']}; "
             f"`{data['command']}`", "", "| figure | Med-DisSeg | nnU-Net's network |", "|---|---|---|"]
    for key in ("eager", "compiled"):
        lines.append(f"| training images/s, {key} | {data.get('train_images_per_s', {}).get(key, '-')} | "
                     f"{data.get('nnunet_train_images_per_s', {}).get(key, '-')} |")
    big = data.get("infer_batch", 32)
    for key in ("b4_fp32", f"b{big}_bf16_channels_last", f"b{big}_bf16_channels_last_compiled"):
        lines.append(f"| inference images/s, {key} | {data.get('infer_images_per_s', {}).get(key, '-')} | "
                     f"{data.get('nnunet_infer_images_per_s', {}).get(key, '-')} |")
    if data.get("forms"):
        lines += ["", "Aggregation-block forms, eager, same run:", "", "| form | figure | images/s |", "|---|---|---|"]
        for form, figures in data["forms"].items():
            lines += [f"| {form} | {k} | {v} |" for k, v in figures.items()]
    if data.get("compile_s"):
        lines += ["", "| compilation (first call) | seconds |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in data["compile_s"].items()]
    blocks = data.get("blocks")
    if blocks:
        lines += ["", f"Batch-{big} bf16 inference forward: wall {blocks['wall_ms']} ms, summed kernel time "
                      f"{blocks['kernel_ms']} ms.", "", "| block | CUDA ms |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in blocks["per_block_ms"].items()]
        lines += ["", "| kernel | calls | self CUDA ms |", "|---|---|---|"]
        lines += [f"| `{k['name'][:90]}` | {k['calls']} | {k['ms']} |" for k in blocks["top_kernels"]]
    if data.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in data["skipped"].items())]
    return "\n".join(lines) + "\n"


def block_profile(net: nn.Module, call: Callable[[], object]) -> dict:
    """Per top-level block CUDA time, wall vs summed kernel time, and the top kernels of one ``call()``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    ranges: List[contextlib.AbstractContextManager] = []
    handles = []
    blocks = [(f"{name}.{i}", item) for name, child in net.named_children()
              for i, item in (enumerate(child) if isinstance(child, nn.ModuleList) else [(None, child)])]
    for name, module in ((n[:-5] if n.endswith(".None") else n, m) for n, m in blocks):
        def pre(_m, _a, name=name):
            ranges.append(record_function(f"block:{name}"))
            ranges[-1].__enter__()

        def post(_m, _a, _o):
            ranges.pop().__exit__(None, None, None)
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    call()
    synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=activities) as prof:
            wall_ms = timed_ms(call)
    finally:
        for h in handles:
            h.remove()
    events = prof.key_averages()

    def device_ms(e, attribute):
        return getattr(e, attribute.replace("cuda", "device"), None) or getattr(e, attribute, 0.0)

    per_block = {e.key[len("block:"):]: round(device_ms(e, "cuda_time_total") / 1e3, 3)
                 for e in events if e.key.startswith("block:")}
    # kernel rows only: operator rows (aten::...) carry their kernels' time as well, and would count it twice
    kernels = [e for e in events if device_ms(e, "self_cuda_time_total") > 0 and not e.key.startswith("block:")
               and getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: -device_ms(e, "self_cuda_time_total"))
    kernel_ms = sum(device_ms(e, "self_cuda_time_total") for e in kernels) / 1e3
    return {"wall_ms": round(wall_ms, 3), "kernel_ms": round(kernel_ms, 3), "per_block_ms": per_block,
            "top_kernels": [{"name": e.key, "calls": e.count, "ms": round(device_ms(e, "self_cuda_time_total") / 1e3, 3)}
                            for e in kernels[:TOP_KERNELS]]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=0, help="training batch; 0: the plan's (8 GB target)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--infer-batch", type=int, default=32, help="the large inference batch (default 32)")
    parser.add_argument("--budget-s", type=float, default=600.0, help="time for all parts (default: 600)")
    parser.add_argument("--parts", nargs="+", choices=("eager", "compiled"), default=("eager", "compiled"),
                        help="eager: parts 1-4; compiled: part 5 (a later run with --parts compiled adds its figures "
                             "to the results file of an earlier one on the same device)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a rehearsal of every part at a small --size (default: cuda)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu rehearses "
              "the parts on the CPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available
    from nnunetv2_meddisseg.blocks.device_forms import FORMS, forced_form
    from nnunetv2_meddisseg.planning.plan_meddisseg import estimate_batch_size
    from nnunetv2_meddisseg.training.compilation import compile_regions

    report = Report(args.out, args.budget_s, device, keep="eager" not in args.parts)
    size, repeats = args.size, args.repeats
    batch = args.batch or estimate_batch_size((size, size), 8.0)
    amp = torch.bfloat16 if precision(device) == "bf16" else torch.float16
    big = args.infer_batch
    report.put("size", size)
    report.put("infer_batch", big)
    report.put("train_batch", batch)
    report.put("train_precision", precision(device) + ("_channels_last" if amp == torch.bfloat16 else ""))

    def images_per_s(fn, n):
        return round(n * 1e3 / median_ms(fn, repeats), 2)

    # 1-2: eager throughput of both networks
    for name, prefix in ((("meddisseg", ""), ("nnunet", "nnunet_")) if "eager" in args.parts else ()):
        net = build(name, deep_supervision=False).to(device).eval()
        report.put(f"{prefix}infer_images_per_s/b4_fp32", images_per_s(inference_call(net, 4, size, None, False, device), 4))
        report.put(f"{prefix}infer_images_per_s/b{big}_bf16_channels_last",
                   images_per_s(inference_call(copy.deepcopy(net), big, size, torch.bfloat16, True, device), big))
        del net
        net = build(name, deep_supervision=True).to(device).train()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()  # the training step's peak alone
        report.put(f"{prefix}train_images_per_s/eager", images_per_s(training_call(net, name, batch, size, amp, device), batch))
        if device.type == "cuda":
            report.put(f"{prefix}peak_train_memory_gib", round(torch.cuda.max_memory_allocated() / 1024 ** 3, 2))
        del net
        report.write()

    # 3: every form of the aggregation block, eager
    reference = None
    for form in (FORMS if "eager" in args.parts else ()):
        if form == "fused" and not fused_cdfa_available(torch.empty(0, device=device)):
            report.skip(f"forms/{form}", "needs Triton and a CUDA device")
            continue
        if report.left() < 60:
            report.skip(f"forms/{form}", "time budget")
            continue
        with forced_form(form):
            net = build("meddisseg", deep_supervision=False).to(device).eval()
            call = inference_call(net, 4, size, None, False, device)
            logits = call().float()
            reference = logits if reference is None else reference  # the first form's output
            report.put(f"forms/{form}/rel_error_vs_{FORMS[0]}",
                       float((logits - reference).norm() / reference.norm()))
            report.put(f"forms/{form}/b4_fp32", images_per_s(call, 4))
            report.put(f"forms/{form}/b{big}_bf16_channels_last",
                       images_per_s(inference_call(net, big, size, torch.bfloat16, True, device), big))
            net = build("meddisseg", deep_supervision=True).to(device).train()
            report.put(f"forms/{form}/train_eager",
                       images_per_s(training_call(net, "meddisseg", batch, size, amp, device), batch))
        del net
        report.write()

    # 4: per-block profile of the batch-32 bf16 inference forward
    if "eager" not in args.parts:
        pass
    elif report.left() > 45:
        net = build("meddisseg", deep_supervision=False).to(device).eval()
        report.put("blocks", block_profile(net, inference_call(net, big, size, torch.bfloat16, True, device)))
        del net
        report.write()
    else:
        report.skip("blocks", "time budget")

    # 5: compiled (the trainer's regional compilation), inference then training, both networks
    for name, prefix in (("meddisseg", ""), ("nnunet", "nnunet_")):
        if "compiled" not in args.parts or report.left() < 30:
            if "compiled" in args.parts:
                report.skip(f"{prefix}compiled", "time budget")
            continue
        net = build(name, deep_supervision=False).to(device).eval()
        compile_regions(net)
        call = inference_call(net, big, size, torch.bfloat16, True, device)
        report.put(f"compile_s/{name}_inference_b32", round(first_call_s(call), 1))
        report.put(f"{prefix}infer_images_per_s/b{big}_bf16_channels_last_compiled", images_per_s(call, big))
        report.write()
        if report.left() < 30:
            report.skip(f"{prefix}train_compiled", "time budget")
            continue
        net = build(name, deep_supervision=True).to(device).train()
        compile_regions(net)
        step = training_call(net, name, batch, size, amp, device)
        report.put(f"compile_s/{name}_training", round(first_call_s(step), 1))
        report.put(f"{prefix}train_images_per_s/compiled", images_per_s(step, batch))
        del net
        report.write()
    from nnunetv2_meddisseg.blocks import device_forms, telu_kernels

    report.put("fused_kernels_failed", {"cdfa": device_forms._fused_failure, "telu": telu_kernels._failure})
    report.write()
    print(f"wrote {report.json_path} and {report.md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
