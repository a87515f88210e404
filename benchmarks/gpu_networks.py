"""Steps 1 (``environment``), 2 (``eager``) and the optional ``compiled`` of ``benchmarks/gpu.py``: the networks
measured in a child process of their own (``gpu.py --step NAME``), which rewrites WORK/steps/NAME.json after every
figure (:class:`StepResults`)."""
import copy
import json
import statistics
from pathlib import Path
from typing import Callable, Optional

from common import (
    NNUNET_ARCHITECTURES,
    block_profile,
    forward,
    machine_info,
    make_batch,
    network_from_plans,
    package_version,
    timed_ms,
)

from nnunetv2_meddisseg.files import write_atomically

REPO = Path(__file__).resolve().parents[1]


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
        write_atomically(self.path, lambda partial: partial.write_text(json.dumps(self.data, indent=1, default=str)))
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

    from nnunetv2_meddisseg.plans_architecture import architecture_entry

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
    from nnunetv2_meddisseg.training.objectives import recipe_stage2_loss, segmentation_loss
    from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe

    net = net.to(memory_format=torch.channels_last) if bf16 else net
    x, target = make_batch(batch, size, device)
    x = x.contiguous(memory_format=torch.channels_last) if bf16 else x
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, fused=device.type == "cuda")
    if name == "meddisseg":
        loss_fn = recipe_stage2_loss(MedDisSegRecipe())
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
            loss = loss_fn(forward(net, x, training=True), target)
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

    def figures(prefix: str, name: str, form: Optional[str] = None) -> None:
        """The figures of network ``name``, its CDFA blocks in ``form`` (None: by device)."""
        def built(deep_supervision: bool):
            net = build(name, deep_supervision, size)
            device_forms.set_implementation_form(net, form)
            return net.to(device)

        net = built(False).eval()
        results.put(f"{prefix}/infer_b4_fp32", images_per_s(inference_call(net, 4, size, False, device), 4))
        results.put(f"{prefix}/infer_b{big}_bf16_channels_last",
                    images_per_s(inference_call(copy.deepcopy(net), big, size, True, device), big))
        del net
        for precision in ("fp32", "bf16"):
            net = built(True).train()
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
        figures("meddisseg_shifted", "meddisseg", "shifted")
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
    """Optional (not in the default steps): both networks compiled as the trainer compiles them (the whole network,
    static shapes), the first call's seconds (compilation included) and the images/s after it."""
    import torch

    from nnunetv2_meddisseg.training.compilation import compile_network

    torch.backends.cudnn.benchmark = True
    device, size, big = torch.device(args.device), args.size, args.infer_batch
    batch = args.batch or plan_batch(size, args.cases[0] + args.cases[1])
    for name in ("meddisseg", "nnunet"):
        net = compile_network(build(name, False, size).to(device).eval())
        call = inference_call(net, big, size, True, device)
        results.put(f"{name}/compile_s_inference", round(timed_ms(call) / 1e3, 1))
        results.put(f"{name}/infer_b{big}_bf16_channels_last", round(big * 1e3 / median_ms(call, args.repeats), 2))
        net = compile_network(build(name, True, size).to(device).train())
        step = training_call(net, name, batch, size, True, device)
        results.put(f"{name}/compile_s_training", round(timed_ms(step) / 1e3, 1))
        results.put(f"{name}/train_bf16", round(batch * 1e3 / median_ms(step, args.repeats), 2))


CHILD_STEPS = {"environment": environment_step, "eager": eager_step, "compiled": compiled_step}
