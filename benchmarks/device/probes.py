"""Measurements of the device run that need torch, each in its own process (``run.py`` starts them).

``python benchmarks/device/probes.py env OUT.json``: step 1, the environment: GPU name and memory,
torch / CUDA / cuDNN / triton versions, a C compiler for torch.compile, and where each package the
run needs is imported from (or why it cannot be).

``python benchmarks/device/probes.py train OUT.json [--size 256] [--batch 0] [--repeats 10]``: step 3,
one Med-DisSeg Stage II training step as nnU-Net's trainer runs it on CUDA: the network in training
mode with deep supervision, the Stage II loss of ``benchmarks/train_step.py`` (with and without the
dispersive loss), fp16 autocast with a GradScaler, gradient clipping at 12 and an Adam step. Images/s
(batch / median step time) and peak memory (``torch.cuda.max_memory_allocated`` from a fresh model;
peak RSS on CPU) per configuration. ``--batch 0``: the batch size ``nnUNetv2_meddisseg_plan`` plans
for a SIZE x SIZE patch with its default 8 GB target. On CPU autocast runs in bf16 and the scaler is
disabled, as nnU-Net's trainer does without CUDA.
"""
import argparse
import importlib
import importlib.metadata
import json
import math
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS))

#: modules the run imports, and the distribution each belongs to (for the report)
MODULES = ("torch", "torchvision", "triton", "numpy", "scipy", "skimage", "sklearn", "matplotlib", "pandas", "PIL",
           "seaborn", "tifffile", "nnunetv2", "dynamic_network_architectures", "batchgenerators", "batchgeneratorsv2",
           "acvl_utils", "cc3d", "blosc2", "ndindex", "msgpack", "numexpr", "httpx", "nibabel", "SimpleITK",
           "nnunetv2_meddisseg")
#: the import chains of the commands the run drives
ENTRY_MODULES = ("nnunetv2.experiment_planning.plan_and_preprocess_entrypoints", "nnunetv2.run.run_training",
                 "nnunetv2.inference.predict_from_raw_data", "nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg",
                 "nnunetv2_meddisseg.planning.plan_meddisseg", "nnunetv2_meddisseg.datasets.convert",
                 "nnunetv2_meddisseg.evaluation.compare")


def _import_report(names) -> dict:
    out = {}
    for name in names:
        try:
            module = importlib.import_module(name)
            found = getattr(module, "__version__", "")
            if not found:
                try:
                    found = importlib.metadata.version(name)
                except importlib.metadata.PackageNotFoundError:
                    found = "?"
            out[name] = {"version": str(found), "file": str(getattr(module, "__file__", ""))}
        except Exception as e:  # noqa: BLE001 - the report names whatever fails
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def environment() -> dict:
    import torch

    info = {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform(),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "cuda_available": torch.cuda.is_available(), "cpu_count": __import__("os").cpu_count(),
            "c_compiler": shutil.which("gcc") or shutil.which("cc") or None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 2),
                    gpu_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                    bf16_supported=torch.cuda.is_bf16_supported())
    info["modules"] = _import_report(MODULES)
    info["entry_points"] = {k: ("ok" if "error" not in v else v["error"]) for k, v in _import_report(ENTRY_MODULES).items()}
    return info


def plan_batch_size(size: int) -> int:
    from nnunetv2_meddisseg.planning.plan_meddisseg import estimate_batch_size

    return estimate_batch_size((size, size), 8.0)


def _amp_step(net, loss_fn, optimizer, scaler, x, target, device):
    """One step as nnU-Net's train_step on CUDA: autocast, scaled backward, unscale, clip 12, step."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    with torch.autocast(device.type, dtype=dtype, enabled=True):
        loss = loss_fn(net(x), target)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(net.parameters(), 12)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def train_config(size: int, batch: int, repeats: int, warmup: int, dispersive: bool, device) -> dict:
    import torch

    from common import build_network, peak_rss_bytes, reset_peak_rss, set_mode, synchronize
    from train_step import Stage2Loss, make_batch

    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    reset_peak_rss()
    net = set_mode(build_network("MedDisSeg", deep_supervision=True).to(device), training=True, deep_supervision=True)
    loss_fn = Stage2Loss(dispersive).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")
    x, target = make_batch(batch, size, device)
    losses, times = [], []
    for i in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        losses.append(float(_amp_step(net, loss_fn, optimizer, scaler, x, target, device)))
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    grads_finite = all(torch.isfinite(p.grad).all().item() for p in net.parameters() if p.grad is not None)
    median = statistics.median(times)
    result = {"dispersive": dispersive, "batch": batch, "size": size, "steps_timed": repeats, "warmup": warmup,
              "median_s_per_step": median, "min_s_per_step": min(times), "images_per_s": batch / median,
              "losses": losses, "all_losses_finite": all(math.isfinite(v) for v in losses),
              "last_grads_finite": grads_finite, "grad_scale": scaler.get_scale() if scaler.is_enabled() else None}
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
        result["memory_measure"] = "torch.cuda.max_memory_allocated (model, Adam state, activations)"
    else:
        result["peak_memory_gib"] = peak_rss_bytes() / 2 ** 30
        result["memory_measure"] = "peak RSS of the process (VmHWM)"
    del net, optimizer
    return result


def training(args) -> dict:
    import torch

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = args.batch or plan_batch_size(args.size)
    out = {"device": str(device), "size": args.size, "batch": batch,
           "batch_source": "argument" if args.batch else "nnUNetv2_meddisseg_plan's estimate (8 GB target)",
           "amp": "fp16 autocast + GradScaler" if device.type == "cuda" else "bf16 autocast (CPU, no scaler)",
           "configs": []}
    for dispersive in (False, True):
        out["configs"].append(train_config(args.size, batch, args.repeats, args.warmup, dispersive, device))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=("env", "train"))
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--batch", type=int, default=0, help="0: the plan's batch size for SIZE x SIZE")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    result = environment() if args.probe == "env" else training(args)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
