"""How far training moved each part of a network: normalisation weights against their start value.

Every BatchNorm / InstanceNorm affine weight starts at exactly 1 and every bias at 0, whatever the
seed, so a final checkpoint alone shows how far they travelled: per top-level module of the network,
the mean |gamma - 1| and mean |beta| over its normalisation layers. With Adam every parameter moves
by at most about the learning rate per step, so the sum of a group's learning rates over the run bounds
the travel; a part whose figures stay far below that bound, or far below the other parts', has hardly
been trained.

Usage: ``python benchmarks/weight_travel.py CHECKPOINT_OR_FOLDER [...] [--name weight_travel] [--out DIR]``;
a folder is searched for ``checkpoint_final.pth`` files (e.g. ``benchmarks/quality.py``'s work folder).
"""
import argparse
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Mapping

import torch

from common import DEFAULT_OUT, command_line, machine_info, markdown_table, write_results

from nnunetv2_meddisseg.torch_files import load_weights_only


def norm_travel(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, dict]:
    """Per top-level module: number of normalisation layers, mean |gamma - 1| and mean |beta|.

    A normalisation layer is a ``<prefix>.weight`` / ``<prefix>.bias`` pair of 1-D tensors next to a
    ``<prefix>.running_var`` (BatchNorm) or, for layers without running statistics, whose last name
    contains ``norm`` (InstanceNorm in nnU-Net's networks: ``...norm.weight``).
    """
    gammas: Dict[str, List[torch.Tensor]] = defaultdict(list)
    betas: Dict[str, List[torch.Tensor]] = defaultdict(list)
    for key, value in state_dict.items():
        if not key.endswith(".weight") or value.ndim != 1:
            continue
        prefix = key[: -len(".weight")]
        last = prefix.rsplit(".", 1)[-1]
        is_norm = f"{prefix}.running_var" in state_dict or "norm" in last
        if not is_norm or f"{prefix}.bias" not in state_dict:
            continue
        part = prefix.split(".", 1)[0]
        gammas[part].append((value.float() - 1).abs().flatten())
        betas[part].append(state_dict[f"{prefix}.bias"].float().abs().flatten())
    return {part: {"layers": len(gammas[part]), "gamma_travel": torch.cat(gammas[part]).mean().item(),
                   "beta_travel": torch.cat(betas[part]).mean().item()} for part in gammas}


def find_checkpoints(paths: List[str]) -> List[Path]:
    found: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(p.rglob("checkpoint_final.pth"))
        elif p.is_file():
            found.append(p)
        else:
            raise SystemExit(f"weight_travel: error: {p} is neither a checkpoint file nor a folder")
    if not found:
        raise SystemExit(f"weight_travel: error: no checkpoint_final.pth under {', '.join(paths)}")
    return found


def run_label(checkpoint: Path) -> str:
    """``<trainer>__<plans>__<configuration>/fold_N`` plus the results folder above it (one per seed)."""
    parts = checkpoint.parts
    return "/".join(parts[-5:-3] + parts[-3:-1]) if len(parts) >= 5 else str(checkpoint)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("paths", nargs="+", help="checkpoint files, or folders searched for checkpoint_final.pth")
    p.add_argument("--name", default="weight_travel")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    runs = {}
    for checkpoint in find_checkpoints(args.paths):
        state = load_weights_only(checkpoint, "checkpoint")
        runs[run_label(checkpoint)] = norm_travel(state.get("network_weights", state))
    rows = [[label, part, t["layers"], f"{t['gamma_travel']:.2e}", f"{t['beta_travel']:.2e}"]
            for label, parts in runs.items() for part, t in parts.items()]
    body = markdown_table(["run", "module", "norm layers", "mean abs(gamma - 1)", "mean abs(beta)"], rows)
    paths = write_results(Path(args.out), args.name, {"machine": machine_info(), "command": command_line(),
                                                       "runs": runs}, body)
    print(body)
    print(f"wrote {paths['json']} and {paths['markdown']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
