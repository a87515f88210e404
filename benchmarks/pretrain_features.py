"""What the pretraining study's networks learned, read from its work folder: per arm and seed, how far the
normalisation weights travelled during the pretraining and during the fine-tuning, the validation pseudo-Dice of
each epoch and the dispersive loss's feature statistics.

Every BatchNorm / InstanceNorm affine weight starts at 1 and every bias at 0, whatever the seed. A run from
scratch therefore travels from there; a pretrained run travels from the weights its pretraining wrote
(``run["pretraining"]["file"]`` in the results file), and the pretraining's own travel is that file's distance
from 1 / 0. Per top-level module (``encoder``, ``decoder``, ...): the mean |gamma - start| over its norm layers.
A part whose travel stays far below the others' has hardly been trained.

Usage: ``python benchmarks/pretrain_features.py --work WORK [--results benchmarks/results/pretrain_study.json]
[--methods ARM ...]``
(``WORK``: the ``--work`` folder of ``benchmarks/quality.py``).
"""
import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Mapping, Optional

import numpy as np
import torch
from common import DEFAULT_OUT, command_line, machine_info, markdown_table, write_results

from nnunetv2_meddisseg.torch_files import read_checkpoint

#: the dispersive loss's statistics of the first regularised layer, logged per epoch by Med-DisSeg's trainer
FEATURE_KEYS = ("dispersion_effective_rank", "dispersion_mean_pairwise_distance")


def norm_layers(state_dict: Mapping[str, torch.Tensor]) -> List[str]:
    """The prefixes of the normalisation layers: a ``.weight`` / ``.bias`` pair of 1-D tensors beside a
    ``.running_var`` (BatchNorm), or whose last name contains ``norm`` (InstanceNorm in nnU-Net's networks)."""
    found = []
    for key, value in state_dict.items():
        if not key.endswith(".weight") or value.ndim != 1:
            continue
        prefix = key[: -len(".weight")]
        if f"{prefix}.bias" in state_dict and (f"{prefix}.running_var" in state_dict
                                               or "norm" in prefix.rsplit(".", 1)[-1]):
            found.append(prefix)
    return found


def norm_travel(state_dict: Mapping[str, torch.Tensor],
                start: Optional[Mapping[str, torch.Tensor]] = None) -> Dict[str, float]:
    """Per top-level module, the mean |gamma - gamma_start| over its norm layers' channels; ``gamma_start`` is
    ``start``'s value where ``start`` holds the layer, else 1."""
    travel: Dict[str, List[torch.Tensor]] = defaultdict(list)
    for prefix in norm_layers(state_dict):
        gamma = state_dict[f"{prefix}.weight"].float()
        origin = start.get(f"{prefix}.weight") if start is not None else None
        origin = torch.ones_like(gamma) if origin is None else origin.float()
        travel[prefix.split(".", 1)[0]].append((gamma - origin).abs().flatten())
    return {part: torch.cat(values).mean().item() for part, values in travel.items()}


def run_checkpoint(work: Path, run: dict) -> Path:
    found = sorted(work.glob(f"runs_{run['budget']}_e*/{run['method']}/seed_{run['seed']}/nnUNet_results/*/*/"
                             "fold_0/checkpoint_final.pth"))
    if len(found) != 1:
        raise SystemExit(f"pretrain_features: error: expected one checkpoint_final.pth of {run['method']} seed "
                         f"{run['seed']} under {work}, found {len(found)}")
    return found[0]


def run_figures(work: Path, run: dict) -> dict:
    checkpoint = read_checkpoint(run_checkpoint(work, run))
    weights, logging = checkpoint["network_weights"], checkpoint["logging"]
    figures = {"method": run["method"], "seed": run["seed"], "pseudo_dice": list(logging["mean_fg_dice"])}
    pretraining = run.get("pretraining")
    start = read_checkpoint(Path(pretraining["file"]).expanduser())["network_weights"] if pretraining else None
    figures["finetune_travel"] = norm_travel(weights, start)
    figures["pretrain_travel"] = norm_travel(start) if start is not None else None
    for key in FEATURE_KEYS:
        values = [v for v in logging.get(key, []) if v is not None and np.isfinite(v)]
        figures[key] = [values[0], values[-1]] if values else None
    return figures


def _mean_sd(values: List[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{np.mean(values):.2e} ± {np.std(values, ddof=1):.1e}" if len(values) > 1 else f"{values[0]:.2e}"


def markdown(runs: List[dict]) -> str:
    arms: Dict[str, List[dict]] = defaultdict(list)
    for r in runs:
        arms[r["method"]].append(r)
    epochs = max(len(r["pseudo_dice"]) for r in runs)
    curve_rows = [[method, len(rs)] + [f"{100 * np.mean([r['pseudo_dice'][e] for r in rs]):.1f}"
                                       for e in range(epochs)] for method, rs in arms.items()]
    parts = ("encoder", "decoder")  # the results file holds every top-level module
    travel_rows = []
    for method, rs in arms.items():
        row = [method] + [_mean_sd([r["finetune_travel"].get(p) for r in rs]) for p in parts]
        row.append(_mean_sd([(r["pretrain_travel"] or {}).get("encoder") for r in rs]))
        for key in FEATURE_KEYS:
            pairs = [r[key] for r in rs if r[key] is not None]
            row.append(" / ".join(f"{np.mean([p[i] for p in pairs]):.3g}" for i in (0, 1)) if pairs else "-")
        travel_rows.append(row)
    return "\n".join([
        "### Validation pseudo-Dice by epoch (%, mean over seeds)", "",
        markdown_table(["arm", "seeds"] + [f"e{e + 1}" for e in range(epochs)], curve_rows), "",
        "### Norm layers' travel (mean |gamma - start|, mean ± sd over seeds) and the features", "",
        "Fine-tuning: from 1 (scratch) or from the pretraining's weights. Pretraining: the encoder's, from 1. "
        "Features: the dispersive loss's first regularised layer, first / last epoch.", "",
        markdown_table(["arm"] + [f"fine-tune {p}" for p in parts] + ["pretraining encoder", "effective rank",
                                                                         "mean pairwise distance"], travel_rows)])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", required=True, help="benchmarks/quality.py's --work folder of the study")
    p.add_argument("--results", default=str(DEFAULT_OUT / "pretrain_study.json"),
                   help="the study's results file (its runs name the arms, seeds and pretraining files)")
    p.add_argument("--methods", nargs="+", default=None,
                   help="only these arms' runs (default: every finished run of the results file)")
    p.add_argument("--name", default="pretrain_features")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    results = Path(args.results)
    if not results.is_file():
        raise SystemExit(f"pretrain_features: error: --results {results} is not a file")
    study = json.loads(results.read_text())
    runs = [run_figures(Path(args.work), r) for r in study["runs"] if r.get("status") == "done"
            and (args.methods is None or r["method"] in args.methods)]
    if not runs:
        raise SystemExit(f"pretrain_features: error: {results} has no finished run"
                         + (f" of {' '.join(args.methods)}" if args.methods else ""))
    body = markdown(runs)
    paths = write_results(Path(args.out), args.name, {"machine": machine_info(), "command": command_line(),
                                                       "study": str(results.name), "runs": runs}, body)
    print(body)
    print(f"wrote {paths['json']} and {paths['markdown']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
