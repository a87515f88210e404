"""Shared helpers of the benchmark scripts: machine description, the networks nnU-Net would use,
alternating timers and result files (JSON + markdown).

The scripts import this module as ``common`` (``python benchmarks/<script>.py`` puts this folder on
``sys.path``).
"""
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Sequence

import torch
from torch import nn

__all__ = [
    "NNUNET_ARCHITECTURES", "NETWORK_NAMES", "DEFAULT_OUT", "machine_info", "command_line", "build_network",
    "set_mode", "alternating_timings", "summarize", "markdown_table",
    "write_results", "synchronize", "parse_device", "peak_rss_bytes", "current_rss_bytes", "reset_peak_rss",
    "parameters", "run_logged",
]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"

# arch_kwargs of the 2d configuration that nnU-Net 2.8.1 plans for a 256x256 RGB dataset: produced by
# ``nnUNetv2_plan_and_preprocess -d 990 -c 2d --no_pp`` (ExperimentPlanner -> nnUNetPlans) and
# ``nnUNetv2_plan_experiment -d 990 -pl nnUNetPlannerResEncM`` (-> nnUNetResEncUNetMPlans) on
# ``nnunetv2_meddisseg.datasets.synthetic.make_synthetic_dataset(raw, dataset_id=990, size=256)``
# (patch size 256 x 256, spacing 1 x 1, 3 channels).
_IMPORTED = ("conv_op", "norm_op", "dropout_op", "nonlin")
NNUNET_ARCHITECTURES: Dict[str, dict] = {
    "PlainConvUNet": {
        "plans": "nnUNetPlans (ExperimentPlanner), 2d",
        "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
        "arch_kwargs": {
            "n_stages": 7,
            "features_per_stage": [32, 64, 128, 256, 512, 512, 512],
            "conv_op": "torch.nn.modules.conv.Conv2d",
            "kernel_sizes": [[3, 3]] * 7,
            "strides": [[1, 1]] + [[2, 2]] * 6,
            "n_conv_per_stage": [2, 2, 2, 2, 2, 2, 2],
            "n_conv_per_stage_decoder": [2, 2, 2, 2, 2, 2],
            "conv_bias": True,
            "norm_op": "torch.nn.modules.instancenorm.InstanceNorm2d",
            "norm_op_kwargs": {"eps": 1e-05, "affine": True},
            "dropout_op": None,
            "dropout_op_kwargs": None,
            "nonlin": "torch.nn.LeakyReLU",
            "nonlin_kwargs": {"inplace": True},
        },
        "_kw_requires_import": _IMPORTED,
    },
}
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
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: str = "cpu") -> dict:
    """Date, CPU model, cores, load, versions and (on CUDA) the GPU of this run."""
    from importlib.metadata import PackageNotFoundError, version

    def _version(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15min": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nnunetv2": _version("nnunetv2"),
        "dynamic_network_architectures": _version("dynamic_network_architectures"),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def command_line() -> str:
    """The exact command of this run, as typed from the repository root."""
    script = os.path.relpath(sys.argv[0], Path(__file__).resolve().parent.parent)
    return " ".join(shlex.quote(a) for a in ["python", script, *sys.argv[1:]])


def build_network(name: str, input_channels: int = 3, num_classes: int = 2, deep_supervision: bool = False) -> nn.Module:
    """One of :data:`NETWORK_NAMES`, as nnU-Net would build it for the 256x256 RGB plans."""
    if name == "MedDisSeg":
        from nnunetv2_meddisseg.architectures import MedDisSegNet

        return MedDisSegNet(input_channels, num_classes, deep_supervision=deep_supervision)
    if name not in NNUNET_ARCHITECTURES:
        raise ValueError(f"unknown network {name!r}: choose from {list(NETWORK_NAMES)}")
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    arch = NNUNET_ARCHITECTURES[name]
    return get_network_from_plans(arch["network_class_name"], arch["arch_kwargs"], arch["_kw_requires_import"],
                                  input_channels, num_classes, allow_init=True, deep_supervision=deep_supervision)


def set_mode(net: nn.Module, training: bool, deep_supervision: bool) -> nn.Module:
    """train()/eval() and the deep-supervision switch nnU-Net sets (``network.decoder.deep_supervision``)."""
    net.train(training)
    net.decoder.deep_supervision = deep_supervision
    return net


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


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out_dir: Path, name: str, payload: dict, markdown_body: str) -> Dict[str, Path]:
    """Write ``<out_dir>/<name>.json`` (payload) and ``<name>.md`` (header with date, machine and
    command, then ``markdown_body``). Returns both paths."""
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
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md_path.write_text("\n".join(header) + "\n" + markdown_body.rstrip() + "\n")
    return {"json": json_path, "markdown": md_path}


def parse_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: CUDA is not available (torch.cuda.is_available() is False)")
    return torch.device(device)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (VmHWM from /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def current_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


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


# ------------------------------------------------------------------------------------------------
# driving nnU-Net's console commands (predict.py, quality.py): the package's own helpers


def run_logged(command: Sequence[str], env: Mapping[str, str], log_file: Path, echo: bool = True,
               check: bool = True) -> float:
    """:func:`nnunetv2_meddisseg.logged_command.run_logged`, a failed command ending the script
    (``SystemExit`` with the one-line message) instead of raising."""
    from nnunetv2_meddisseg.logged_command import CommandFailed
    from nnunetv2_meddisseg.logged_command import run_logged as package_run_logged

    try:
        return package_run_logged(command, env, log_file, echo=echo, check=check)
    except CommandFailed as e:
        raise SystemExit(str(e)) from None
