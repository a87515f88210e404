"""Med-DisSeg and nnU-Net's network on one CUDA GPU: throughput, per-block time, top kernels, compile time.

Side by side in one process (``cudnn.benchmark`` on, as nnU-Net sets it), medians of ``--repeats`` calls:
``eager``: the Stage II training step at the plan's batch (bf16 + channels-last where supported, else fp16 with a
GradScaler) and inference at batch 4 fp32 and ``--infer-batch`` bf16 + channels-last, of both networks; the same
for each aggregation-block form; a per-block profile of the large inference batch. ``compiled``: both under the
trainer's regional compilation, with the seconds of each first call. Parts that ``--budget-s`` cannot hold are
skipped and say so. ``--device cpu`` rehearses every part at a small size (its figures mean nothing).
"""
import copy
import platform
import statistics
import sys
from typing import Callable, Optional

import torch
from torch import nn

from common import (NNUNET_ARCHITECTURES, PartialResults, argument_parser, block_profile, make_batch, markdown_table,
                    network_from_plans, package_version, stage2_loss, timed_ms)


def build(name: str, deep_supervision: bool) -> nn.Module:
    """``meddisseg`` (the default plans' MedDisSegNet) or ``nnunet`` (nnU-Net's default 2D network), 3 -> 2 classes."""
    from nnunetv2_meddisseg.plans_entry import architecture_entry

    torch.manual_seed(0)
    entry = architecture_entry() if name == "meddisseg" else NNUNET_ARCHITECTURES["PlainConvUNet"]
    return network_from_plans(entry, 3, 2, deep_supervision)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after ``min(warmup, repeats)`` warm-up calls."""
    for _ in range(min(warmup, repeats)):
        fn()
    return statistics.median(timed_ms(fn) for _ in range(repeats))


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
    from nnunetv2_meddisseg.training.nnunet_copies import backward_clip_step
    from nnunetv2_meddisseg.training.objectives import segmentation_loss

    channels_last = amp == torch.bfloat16
    net = net.to(memory_format=torch.channels_last) if channels_last else net
    x, target = make_batch(batch, size, device)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
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
        with torch.autocast(device.type, dtype=amp):
            loss = loss_fn(net(x), target)
        backward_clip_step(loss, optimizer, scaler, net.parameters())  # the trainers' update, clipping at 12
        return loss
    return step


class Report(PartialResults):
    """The results, rewritten to JSON and markdown after every part."""

    def __init__(self, out, budget_s: float, device: torch.device, keep: bool = False) -> None:
        name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.machine()})"
        super().__init__(out, "gpu", name, budget_s, markdown, keep)
        self.data.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                         triton=package_version("triton"), python=platform.python_version(), cudnn_benchmark=True)
        self.data.setdefault("skipped", {})

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
        rows = [[form, k, v] for form, figures in data["forms"].items() for k, v in figures.items()]
        lines += ["", "Aggregation-block forms, eager, same run:", "",
                  markdown_table(["form", "figure", "images/s"], rows)]
    if data.get("compile_s"):
        lines += ["", markdown_table(["compilation (first call)", "seconds"], list(data["compile_s"].items()))]
    blocks = data.get("blocks")
    if blocks:
        kernels = [[f"`{k['name'][:90]}`", k["calls"], k["ms"]] for k in blocks["top_kernels"]]
        lines += ["", f"Batch-{big} bf16 inference forward: wall {blocks['wall_ms']} ms, summed kernel time "
                      f"{blocks['kernel_ms']} ms.", ""]
        lines += [markdown_table(["block", "CUDA ms"], blocks["per_block_ms"].items()), "",
                  markdown_table(["kernel", "calls", "self CUDA ms"], kernels)]
    if data.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(f"{k} ({v})" for k, v in data["skipped"].items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argument_parser(__doc__, "gpu_<device>")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=0, help="training batch; 0: the plan's (8 GB target)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--infer-batch", type=int, default=32, help="the large inference batch")
    parser.add_argument("--budget-s", type=float, default=600.0, help="time for all parts")
    parser.add_argument("--parts", nargs="+", choices=("eager", "compiled"), default=("eager", "compiled"),
                        help="a later run with --parts compiled adds its figures to the results file of an earlier "
                             "one on the same device")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a rehearsal of every part at a small --size")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu rehearses "
              "the parts on the CPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = True
    device = torch.device(args.device)
    from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available
    from nnunetv2_meddisseg.blocks.device_forms import FORMS, forced_form
    from nnunetv2_meddisseg.planning.memory import batch_size_for_memory, estimated_memory_line
    from nnunetv2_meddisseg.training.compilation import compile_regions

    report = Report(args.out, args.budget_s, device, keep="eager" not in args.parts)
    size, repeats, big = args.size, args.repeats, args.infer_batch
    batch = args.batch or batch_size_for_memory(estimated_memory_line((size, size)), 8.0)
    # bf16 + channels-last where the GPU supports bf16 (as training and prediction use it there), else fp16
    amp = torch.bfloat16 if device.type != "cuda" or torch.cuda.is_bf16_supported() else torch.float16
    report.put("size", size)
    report.put("infer_batch", big)
    report.put("train_batch", batch)
    report.put("train_precision", "bf16_channels_last" if amp == torch.bfloat16 else "fp16")

    def images_per_s(fn, n):
        return round(n * 1e3 / median_ms(fn, repeats), 2)

    def put_inference(prefix: str, net: nn.Module, copy_for_big: bool = False) -> None:
        report.put(f"{prefix}/b4_fp32", images_per_s(inference_call(net, 4, size, None, False, device), 4))
        large = copy.deepcopy(net) if copy_for_big else net
        report.put(f"{prefix}/b{big}_bf16_channels_last",
                   images_per_s(inference_call(large, big, size, torch.bfloat16, True, device), big))

    # eager throughput of both networks
    for name, prefix in ((("meddisseg", ""), ("nnunet", "nnunet_")) if "eager" in args.parts else ()):
        put_inference(f"{prefix}infer_images_per_s", build(name, deep_supervision=False).to(device).eval(), True)
        net = build(name, deep_supervision=True).to(device).train()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()  # the training step's peak alone
        report.put(f"{prefix}train_images_per_s/eager",
                   images_per_s(training_call(net, name, batch, size, amp, device), batch))
        if device.type == "cuda":
            report.put(f"{prefix}peak_train_memory_gib", round(torch.cuda.max_memory_allocated() / 1024 ** 3, 2))
        del net
        report.write()

    # every form of the aggregation block, eager
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
            logits = inference_call(net, 4, size, None, False, device)().float()
            reference = logits if reference is None else reference  # the first form's output
            report.put(f"forms/{form}/rel_error_vs_{FORMS[0]}", float((logits - reference).norm() / reference.norm()))
            put_inference(f"forms/{form}", net)
            net = build("meddisseg", deep_supervision=True).to(device).train()
            report.put(f"forms/{form}/train_eager",
                       images_per_s(training_call(net, "meddisseg", batch, size, amp, device), batch))
        del net
        report.write()

    # per-block profile of the large bf16 inference forward
    if "eager" in args.parts and report.left() > 45:
        net = build("meddisseg", deep_supervision=False).to(device).eval()
        report.put("blocks", block_profile(net, inference_call(net, big, size, torch.bfloat16, True, device)))
        del net
        report.write()
    elif "eager" in args.parts:
        report.skip("blocks", "time budget")

    # compiled (the trainer's regional compilation), inference then training, both networks; the first call's
    # time includes the compilation
    for name, prefix in ((("meddisseg", ""), ("nnunet", "nnunet_")) if "compiled" in args.parts else ()):
        if report.left() < 30:
            report.skip(f"{prefix}compiled", "time budget")
            continue
        net = build(name, deep_supervision=False).to(device).eval()
        compile_regions(net)
        call = inference_call(net, big, size, torch.bfloat16, True, device)
        report.put(f"compile_s/{name}_inference_b32", round(timed_ms(call) / 1e3, 1))
        report.put(f"{prefix}infer_images_per_s/b{big}_bf16_channels_last_compiled", images_per_s(call, big))
        report.write()
        if report.left() < 30:
            report.skip(f"{prefix}train_compiled", "time budget")
            continue
        net = build(name, deep_supervision=True).to(device).train()
        compile_regions(net)
        step = training_call(net, name, batch, size, amp, device)
        report.put(f"compile_s/{name}_training", round(timed_ms(step) / 1e3, 1))
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
