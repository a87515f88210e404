"""Shared helpers of the benchmark scripts (imported as ``common``: ``python benchmarks/<script>.py`` puts this
folder on ``sys.path``): machine description, the networks nnU-Net would use, alternating timers, block
profiles and result files (JSON + markdown)."""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from nnunetv2_meddisseg.files import write_atomically

DEFAULT_OUT = Path(__file__).resolve().parent / "results"

# arch_kwargs of the 2d configuration that nnU-Net 2.8.1 plans for a 256x256 RGB dataset: produced by
# ``nnUNetv2_plan_and_preprocess -d 990 -c 2d --no_pp`` (ExperimentPlanner -> nnUNetPlans) and
# ``nnUNetv2_plan_experiment -d 990 -pl nnUNetPlannerResEncM`` (-> nnUNetResEncUNetMPlans) on
# ``nnunetv2_meddisseg.datasets.synthetic.make_synthetic_dataset(raw, dataset_id=990, size=256)``
# (patch size 256 x 256, spacing 1 x 1, 3 channels).
_IMPORTED = ("conv_op", "norm_op", "dropout_op", "nonlin")
NNUNET_ARCHITECTURES: Dict[str, dict] = {"PlainConvUNet": {
    "plans": "nnUNetPlans (ExperimentPlanner), 2d",
    "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "arch_kwargs": {"n_stages": 7, "features_per_stage": [32, 64, 128, 256, 512, 512, 512],
                    "conv_op": "torch.nn.modules.conv.Conv2d", "kernel_sizes": [[3, 3]] * 7,
                    "strides": [[1, 1]] + [[2, 2]] * 6, "n_conv_per_stage": [2] * 7,
                    "n_conv_per_stage_decoder": [2] * 6,
                    "conv_bias": True, "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
                    "norm_op_kwargs": {"eps": 1e-05, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
                    "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
    "_kw_requires_import": _IMPORTED,
}}
#: nnU-Net's residual-encoder network for the same data: the same kwargs but for the blocks per stage
NNUNET_ARCHITECTURES["ResEncM"] = {
    "plans": "nnUNetResEncUNetMPlans (nnUNetPlannerResEncM), 2d",
    "network_class_name": "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet",
    "arch_kwargs": {**{k: v for k, v in NNUNET_ARCHITECTURES["PlainConvUNet"]["arch_kwargs"].items()
                       if k != "n_conv_per_stage"},
                    "n_blocks_per_stage": [1, 3, 4, 6, 6, 6, 6], "n_conv_per_stage_decoder": [1, 1, 1, 1, 1, 1]},
    "_kw_requires_import": _IMPORTED,
}

#: Med-DisSeg and the two networks nnU-Net plans for the same data
NETWORK_NAMES = ("MedDisSeg", "PlainConvUNet", "ResEncM")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.lower().startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def machine_info(device: str = "cpu") -> dict:
    """Date, CPU model, cores, load, versions and (on CUDA) the GPU of this run."""
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": _cpu_model(),
            "cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15min": load_average(), "python": platform.python_version(), "torch": torch.__version__,
            "nnunetv2": package_version("nnunetv2"),
            "dynamic_network_architectures": package_version("dynamic_network_architectures"), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def load_average() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def command_line() -> str:
    """The exact command of this run, as typed from the repository root."""
    script = os.path.relpath(sys.argv[0], Path(__file__).resolve().parent.parent)
    return " ".join(shlex.quote(a) for a in ["python", script, *sys.argv[1:]])


def argument_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The parser of a measuring script (the first paragraph of ``doc`` as its description), with ``--out``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"folder for {name}.json / .md")
    return p


def build_network(name: str, input_channels: int = 3, num_classes: int = 2,
                  deep_supervision: bool = False) -> nn.Module:
    """One of :data:`NETWORK_NAMES`, as nnU-Net would build it for the 256x256 RGB plans."""
    if name == "MedDisSeg":
        from nnunetv2_meddisseg.architectures import MedDisSegNet

        return MedDisSegNet(input_channels, num_classes, deep_supervision=deep_supervision)
    if name not in NNUNET_ARCHITECTURES:
        raise ValueError(f"unknown network {name!r}: choose from {list(NETWORK_NAMES)}")
    return network_from_plans(NNUNET_ARCHITECTURES[name], input_channels, num_classes, deep_supervision)


def network_from_plans(entry: dict, input_channels: int, num_classes: int, deep_supervision: bool) -> nn.Module:
    """nnU-Net's ``get_network_from_plans`` on a plans' architecture entry."""
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    return get_network_from_plans(entry["network_class_name"], dict(entry["arch_kwargs"]),
                                  entry["_kw_requires_import"], input_channels, num_classes, allow_init=True,
                                  deep_supervision=deep_supervision)


def set_mode(net: nn.Module, training: bool, deep_supervision: bool) -> nn.Module:
    """train()/eval() and the deep-supervision switch nnU-Net sets on its networks
    (``network.decoder.deep_supervision``; MedDisSegNet's output is chosen per call, :func:`forward`)."""
    net.train(training)
    net.decoder.deep_supervision = deep_supervision
    return net


def forward(net: nn.Module, x, training: bool):
    """``net(x)`` as a training step calls it (MedDisSegNet: every output, ``output="all"``; nnU-Net's networks:
    what :func:`set_mode` switched on) or as prediction does (logits)."""
    from nnunetv2_meddisseg.architectures import MedDisSegNet
    from nnunetv2_meddisseg.module_wrappers import unwrap_module

    if training and isinstance(unwrap_module(net), MedDisSegNet):
        return net(x, output="all")
    return net(x)


def make_batch(batch: int, size: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded random RGB images and a disc of random radius per image as the foreground target."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=g)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    radius = torch.rand(batch, generator=g) * size / 4 + size / 8
    target = ((yy - size / 2) ** 2 + (xx - size / 2) ** 2)[None] < radius[:, None, None] ** 2
    return x.to(device), target[:, None].float().to(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternating_timings(fns: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 1,
                        device: torch.device = torch.device("cpu")) -> Dict[str, List[float]]:
    """Seconds per call of each function, measured in rounds that call every function once.

    The order inside a round rotates from round to round, so that a slow phase of a shared, noisy
    machine hits all candidates alike. ``warmup`` untimed rounds come first.
    """
    names = list(fns)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start = time.perf_counter()
            fns[name]()
            synchronize(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def summarize(samples: Sequence[float]) -> dict:
    """median / min / max / quartiles of a list of timings (seconds)."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median_s": statistics.median(s), "min_s": s[0], "max_s": s[-1], "q1_s": q[0], "q3_s": q[2],
            "n": len(s)}


def timed_ms(fn: Callable[[], object], cuda: bool = None) -> float:
    """Milliseconds of one ``fn()``: CUDA events on a GPU, the host clock elsewhere."""
    if not (torch.cuda.is_available() if cuda is None else cuda):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def top_level_blocks(net: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """(name, module) of every child of ``net``, the items of a ModuleList or ModuleDict one by one."""
    for name, child in net.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            yield from ((f"{name}.{key}", item) for key, item in child.named_children())
        else:
            yield name, child


def block_profile(net: nn.Module, call: Callable[[], object], top: int = 20) -> dict:
    """One profiled ``call()`` (after an unprofiled one): the time of each top-level block (a ``record_function``
    range pushed by forward hooks), the call's wall time against its summed kernel (CUDA) or operator self (CPU)
    time, and the ``top`` kernels or operators with the most self time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = next(net.parameters()).device.type == "cuda"
    ranges, handles = [], []
    for name, module in top_level_blocks(net):
        def pre(_m, _a, name=name):
            ranges.append(record_function(f"block:{name}"))
            ranges[-1].__enter__()

        def post(_m, _a, _o):
            ranges.pop().__exit__(None, None, None)
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        call()
        synchronize(torch.device("cuda" if cuda else "cpu"))
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            wall_ms = timed_ms(call, cuda)
    finally:
        for h in handles:
            h.remove()
    kind = "cuda" if cuda else "cpu"

    def ms(event, attribute: str) -> float:  # recent torch versions name the CUDA attributes device_*
        attribute = attribute.format(kind)
        return (getattr(event, attribute.replace("cuda", "device"), None) or getattr(event, attribute, 0.0)) / 1e3

    events = prof.key_averages()
    per_block = {e.key[len("block:"):]: round(ms(e, "{}_time_total"), 3) for e in events if e.key.startswith("block:")}
    # kernel (or operator) rows by self time, so that nested operators do not count twice
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = [e for e in events if ms(e, "self_{}_time_total") > 0 and not e.key.startswith("block:")
               and getattr(e, "device_type", None) == device_type]
    kernels.sort(key=lambda e: -ms(e, "self_{}_time_total"))
    return {"wall_ms": round(wall_ms, 3), "kernel_ms": round(sum(ms(e, "self_{}_time_total") for e in kernels), 3),
            "per_block_ms": per_block,
            "top_kernels": [{"name": e.key, "calls": e.count, "ms": round(ms(e, "self_{}_time_total"), 3)}
                            for e in kernels[:top]]}


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out_dir: Path, name: str, payload: dict, markdown_body: str) -> Dict[str, Path]:
    """Write ``<out_dir>/<name>.json`` (payload) and ``<name>.md`` (header with date, machine and
    command, then ``markdown_body``), each replaced whole (``files.write_atomically``: a kill leaves the previous
    file). Paths in the home folder are written as ``~/...``: a results file does not name the machine's home.
    Returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = payload["machine"]
    header = [f"# {name}", "", f"- date: {machine['date']}",
              f"- machine: {machine['cpu']}, {machine['cpu_cores']} cores ({machine['torch_threads']} torch threads), "
              f"load average {machine['load_average_1_5_15min']}"
              + (f"; GPU {machine['gpu']} (CUDA {machine['cuda']})" if "gpu" in machine else ""),
              f"- versions: torch {machine['torch']}, nnunetv2 {machine['nnunetv2']}, "
              f"dynamic_network_architectures {machine['dynamic_network_architectures']}, python {machine['python']}",
              f"- command: `{payload['command']}`", ""]
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    for path, text in ((json_path, json.dumps(payload, indent=2, default=str) + "\n"),
                       (md_path, "\n".join(header) + "\n" + markdown_body.rstrip() + "\n")):
        text = text.replace(str(Path.home()) + "/", "~/")
        write_atomically(path, lambda partial, text=text: partial.write_text(text))
    return {"json": json_path, "markdown": md_path}


def report(out_dir: Path, name: str, payload: dict, markdown_body: str, missed: Optional[str] = None) -> int:
    """:func:`write_results`, then print the markdown, where both files are and ``missed`` (a target missed, the
    exit status then 1)."""
    files = write_results(out_dir, name, payload, markdown_body)
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    if missed:
        print(f"TARGET MISSED: {missed}", file=sys.stderr)
    return 1 if missed else 0


def dataset_folder(root: str, dataset: str) -> Path:
    """``root/DatasetXXX_Name`` for a dataset ID or name (a ``SystemExit`` naming what was found otherwise)."""
    pattern = f"Dataset{int(dataset):03d}_*" if str(dataset).isdigit() else dataset
    found = sorted(p for p in Path(root).glob(pattern) if p.is_dir())
    if len(found) != 1:
        raise SystemExit(f"dataset {dataset}: expected one folder {pattern} in {root}, found "
                         f"{', '.join(p.name for p in found) or 'none'}")
    return found[0]


def write_kvasir_split(target: Path, counts: Sequence[Optional[int]], description: str) -> dict:
    """A ``--split_file`` (JSON) with the first ``counts`` (train, val, test; None: all) cases of each part of the
    shipped Kvasir-SEG split."""
    shipped = json.loads((Path(__file__).resolve().parents[1] / "nnunetv2_meddisseg" / "datasets" / "splits"
                          / "kvasir_seg.json").read_text())
    split = {"description": description, **{key: shipped[key][:n] for key, n in zip(("train", "val", "test"), counts)}}
    target.write_text(json.dumps(split, indent=1) + "\n")
    return split


def parse_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: CUDA is not available (torch.cuda.is_available() is False)")
    return torch.device(device)


def rss_bytes(peak: bool = False) -> int:
    """Resident set size of this process now (VmRSS), or its peak (VmHWM), from /proc/self/status."""
    field = "VmHWM:" if peak else "VmRSS:"
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs). False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
