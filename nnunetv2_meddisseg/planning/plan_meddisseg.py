"""``nnUNetv2_meddisseg_plan``: derive ``nnUNetMedDisSegPlans.json`` from a dataset's ``nnUNetPlans.json``.

Reuses the ``nnUNetPlans_2d`` data, as nnU-Net's ResEnc presets do; only 2d's architecture, patch and batch size change.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import write_atomically
from nnunetv2_meddisseg.planning.memory import TRAINING_BYTES_PER_PIXEL, batch_size_for_memory, estimated_memory_line
from nnunetv2_meddisseg.plans_architecture import ADDED_NORMS, DEFAULT_ADDED_NORM, architecture_entry

if TYPE_CHECKING:
    from nnunetv2_meddisseg.planning.memory import MemoryLine

__all__ = ["build_meddisseg_plans", "plan_meddisseg", "main"]

DEFAULT_PLANS_NAME = "nnUNetMedDisSegPlans"
SIZE_MULTIPLE = 16
PLANS_NAME = re.compile(r"[A-Za-z0-9_.-]+")
def _round_up_to_multiple(size: int) -> int:
    return max(SIZE_MULTIPLE, math.ceil(size / SIZE_MULTIPLE) * SIZE_MULTIPLE)


def build_meddisseg_plans(source_plans: dict, plans_name: str = DEFAULT_PLANS_NAME,
                          patch_size: Optional[Tuple[int, int]] = None, batch_size: Optional[int] = None,
                          memory_target_gb: float = 8.0, num_training_cases: Optional[int] = None,
                          memory_line: Optional[Callable[[Tuple[int, int], dict], "MemoryLine"]] = None,
                          **arch_kwargs) -> dict:
    """A new plans dict with one ``2d`` configuration running MedDisSegNet (``arch_kwargs``: ``default_arch_kwargs``).

    Without ``batch_size``: the largest batch whose training memory fits ``memory_target_gb``, by ``memory_line``
    where given, else estimated; ``batch_size_source`` records which."""
    configurations = source_plans.get("configurations", {})
    if "2d" not in configurations:
        raise UserError(f"plans '{source_plans.get('plans_name')}' of {source_plans.get('dataset_name')} have no "
                        f"'2d' configuration (found: {', '.join(configurations) or 'none'}); Med-DisSeg is a 2D "
                        f"network: run nnUNetv2_plan_and_preprocess with -c 2d")
    source_2d = configurations["2d"]
    if "inherits_from" in source_2d:
        raise UserError("the source plans' 2d configuration inherits from another one; expected a plain 2d "
                        "configuration as nnUNetv2_plan_and_preprocess writes it")
    if patch_size is None:
        patch_size = tuple(_round_up_to_multiple(s) for s in source_2d["patch_size"])
    else:
        patch_size = tuple(int(s) for s in patch_size)
        if len(patch_size) != 2 or any(s <= 0 or s % SIZE_MULTIPLE for s in patch_size):
            raise UserError(f"--patch_size must be two positive multiples of {SIZE_MULTIPLE} (H W), got "
                            f"{' '.join(map(str, patch_size))}")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch_size must be at least 1, got {batch_size}")
    architecture = architecture_entry(**arch_kwargs)
    if batch_size is None:
        max_bs = None
        if num_training_cases is not None:
            # as nnU-Net: a batch should not cover more than 5 % of the data set
            median = source_2d.get("median_image_size_in_voxels", patch_size)
            max_bs = int(0.05 * num_training_cases * math.prod(median) / math.prod(patch_size))
        line = estimated_memory_line(patch_size) if memory_line is None else memory_line(patch_size, architecture)
        batch_size = batch_size_for_memory(line, memory_target_gb, max_batch_size=max_bs)
        if memory_line is None:
            source = (f"{memory_target_gb:g} GiB target, estimated from a CPU measurement "
                      f"({TRAINING_BYTES_PER_PIXEL} bytes per pixel and sample)")
        else:
            source = (f"{memory_target_gb:g} GiB target, {line.describe()}: "
                      f"{line.peak_bytes(batch_size) / 1024 ** 3:.2f} GiB expected at batch {batch_size}")
        if max_bs is not None and batch_size == max(max_bs, 2):
            source += f"; capped at 5 % of the {num_training_cases} training cases"
    else:
        source = "--batch_size"

    config = {**deepcopy(source_2d), "patch_size": list(patch_size), "batch_size": int(batch_size),
              "batch_size_source": source, "architecture": architecture}
    return {**deepcopy(source_plans), "plans_name": plans_name, "configurations": {"2d": config}}


def _memory_measurement(memory_from: str) -> Optional[Callable]:
    """The ``memory_line`` of :func:`build_meddisseg_plans` for ``--memory_from`` (None: the estimate)."""
    if memory_from not in ("auto", "gpu", "estimate"):
        raise UserError(f"--memory_from must be auto, gpu or estimate, got {memory_from!r}")
    if memory_from == "estimate":
        return None
    import torch

    if not torch.cuda.is_available():
        if memory_from == "gpu":
            raise UserError("--memory_from gpu: no CUDA GPU is available here (torch.cuda.is_available() is False); "
                            "use --memory_from estimate")
        return None
    from nnunetv2_meddisseg.planning.memory import measure_training_memory

    return measure_training_memory


def _check_encoder_weights(weights: str, input_channels: int) -> str:
    """The value to record: ``imagenet`` (cached by torch.hub now; training only reads the cache) or the file's
    absolute path. The file is loaded into a fresh encoder now, so a bad one fails at planning, not after hours."""
    from nnunetv2_meddisseg.blocks.encoder import IMAGENET, download_imagenet_weights

    if weights != IMAGENET:
        return _check_weights_file(weights, input_channels)
    try:
        cached = download_imagenet_weights()
    except FileNotFoundError as e:
        raise UserError(f"--encoder_weights imagenet: {e}") from None
    _check_weights_file(cached, input_channels)
    return IMAGENET


def _check_weights_file(path: str, input_channels: int) -> str:
    """Load the file into a fresh encoder of ``input_channels`` now; return its absolute path."""
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights
    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile, is_torch_file, refusal_reason

    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UserError(f"--encoder_weights: file {path} does not exist (expected a torchvision ResNet-50 "
                        f"state dict saved with torch.save)")
    if not is_torch_file(path):
        raise UserError(f"--encoder_weights: {path} is not a file written by torch.save (expected a torchvision "
                        f"ResNet-50 state dict)")
    try:
        load_resnet50_weights(ResNet50Encoder(input_channels), path)
    except UnsafeTorchFile as e:
        raise UserError(f"--encoder_weights: {path} holds pickled objects, not a plain state dict "
                        f"({refusal_reason(e)}; not loaded, since loading them can run code; a whole model? save "
                        f"model.state_dict() instead)") from None
    except ValueError as e:
        raise UserError(f"--encoder_weights: {e}") from None
    return path


def check_plans_name(name: str, option: str = "--plans_name") -> None:
    """A plans name is a file name stem (letters, digits, ``_ . -``), never a path."""
    if not PLANS_NAME.fullmatch(name) or name.startswith("."):
        raise UserError(f"{option} must be a name of letters, digits, '_', '.' and '-' (the plans file "
                        f"<name>.json in the dataset's preprocessed folder), not a path: got {name!r}")


def check_memory_target(memory_target_gb: float) -> None:
    """``--gpu_memory_target``: a finite number of GB above 0."""
    if not math.isfinite(memory_target_gb) or memory_target_gb <= 0:
        raise UserError(f"--gpu_memory_target must be a finite number of GB above 0, got {memory_target_gb}")


def _read_json(file: Path, dataset: str) -> dict:
    """A JSON file of nnU-Net's planning; an error naming it where it is not valid JSON."""
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise UserError(f"{file} is not valid JSON ({e}): a truncated or hand-edited file? rerun "
                        f"nnUNetv2_plan_and_preprocess -d {dataset} -c 2d") from None


def differences(old: object, new: object, where: str = "") -> List[str]:
    """``<key path>: <old> -> <new>`` for every value that differs between two JSON documents."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in list(old) + [k for k in new if k not in old]:
            found += differences(old.get(key, "(none)"), new.get(key, "(none)"), f"{where}.{key}" if where else key)
        return found
    return [] if old == new else [f"{where}: {json.dumps(old)} -> {json.dumps(new)}"]


def _write_plans(plans: dict, target: Path, overwrite: bool) -> None:
    """Write ``plans`` to ``target`` through a temporary file; other content there is refused unless ``overwrite``."""
    if target.exists() and not overwrite:
        try:
            existing = json.loads(target.read_text())
        except ValueError:
            existing = {}
        # the record of how the batch was chosen is no setting (a measured peak varies in its last digits)
        changed = [d for d in differences(existing, plans) if not d.startswith("configurations.2d.batch_size_source:")]
        if changed:
            shown = "; ".join(changed[:3]) + (f"; and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise UserError(f"{target} exists with other settings ({shown}): pass --overwrite to replace it (a "
                            f"training run resumed with --c would then continue on the new plans) or choose "
                            f"another --plans_name")
    try:
        write_atomically(target, lambda tmp: tmp.write_text(json.dumps(plans, indent=4)))
    except OSError as e:
        raise UserError(f"cannot write {target}: {e.strerror or e}") from None


def _read_recipe(path: str) -> dict:
    """The recipe settings in the JSON file ``path``, checked against ``nnUNetTrainerMedDisSeg``'s recipe."""
    from nnunetv2_meddisseg.training.recipe import MedDisSegRecipe, apply_overrides, read_override_file

    try:
        overrides = read_override_file(path)
        apply_overrides(MedDisSegRecipe(), overrides, path)
    except ValueError as e:
        raise UserError(f"--recipe {e}") from None
    return overrides


def plan_meddisseg(dataset: str, plans_name: str = DEFAULT_PLANS_NAME, source_plans_name: str = "nnUNetPlans",
                   encoder_weights: Optional[str] = None, overwrite: bool = False, memory_from: str = "auto",
                   recipe: Optional[str] = None, **kwargs) -> Path:
    """Write ``$nnUNet_preprocessed/DatasetXXX_Name/<plans_name>.json`` and return its path.

    Other content there is refused unless ``overwrite``. ``memory_from``: ``gpu`` (measured on this CUDA GPU),
    ``estimate`` or ``auto`` (``gpu`` where available). ``recipe``: a JSON file of recipe settings, stored in the plans
    as the trainer's overrides."""
    overrides = _read_recipe(recipe) if recipe is not None else None
    check_plans_name(plans_name)
    check_plans_name(source_plans_name, "--source_plans")
    if "memory_target_gb" in kwargs:
        check_memory_target(kwargs["memory_target_gb"])
    preprocessed = os.environ.get("nnUNet_preprocessed")
    if not preprocessed:
        raise UserError("the environment variable nnUNet_preprocessed is not set (see the README's "
                        "'nnU-Net environment variables')")
    from nnunetv2.utilities.dataset_name_id_conversion import maybe_convert_to_dataset_name

    try:
        dataset_name = maybe_convert_to_dataset_name(dataset)
    except (RuntimeError, ValueError):
        raw = os.environ.get("nnUNet_raw") or "nnUNet_raw is not set"
        raise UserError(f"-d {dataset}: the dataset is missing from nnUNet_raw ({raw}) and nnUNet_preprocessed "
                        f"({preprocessed}); create it with nnUNetv2_meddisseg_convert (or copy an nnU-Net dataset "
                        f"into nnUNet_raw), then run nnUNetv2_plan_and_preprocess -d {dataset} -c 2d") from None
    folder = Path(preprocessed) / dataset_name
    source_file = folder / f"{source_plans_name}.json"
    if not source_file.is_file():
        raise UserError(f"{source_file} not found: the dataset is not planned and preprocessed yet; run "
                        f"nnUNetv2_plan_and_preprocess -d {dataset} -c 2d first")
    if plans_name == source_plans_name:
        raise UserError(f"--plans_name must differ from the source plans '{source_plans_name}'")
    source = _read_json(source_file, dataset)
    dataset_json_file = folder / "dataset.json"
    dataset_json = _read_json(dataset_json_file, dataset) if dataset_json_file.is_file() else {}
    if encoder_weights is not None:
        channels = dataset_json.get("channel_names", dataset_json.get("modality"))
        encoder_weights = _check_encoder_weights(encoder_weights, len(channels) if isinstance(channels, dict) and
                                                 channels else 3)
    plans = build_meddisseg_plans(source, plans_name, encoder_weights=encoder_weights,
                                  num_training_cases=dataset_json.get("numTraining"),
                                  memory_line=_memory_measurement(memory_from), **kwargs)
    if overrides is not None:
        from nnunetv2_meddisseg.training.recipe import RECIPE_PLANS_KEY

        plans[RECIPE_PLANS_KEY] = overrides
    data = folder / source["configurations"]["2d"]["data_identifier"]
    if not data.is_dir():
        raise UserError(f"{data} not found: the 2d data is not preprocessed yet; run nnUNetv2_plan_and_preprocess "
                        f"-d {dataset} -c 2d")
    target = folder / f"{plans_name}.json"
    _write_plans(plans, target, overwrite)
    return target


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nnUNetv2_meddisseg_plan", formatter_class=DefaultsHelpFormatter, description=(
        "Derive a Med-DisSeg plan (nnUNetMedDisSegPlans.json) from a dataset's nnUNetPlans.json, reusing its "
        "preprocessed 2d data. Train with: nnUNetv2_train ID 2d FOLD -tr nnUNetTrainerMedDisSeg -p "
        "nnUNetMedDisSegPlans"))
    p.add_argument("-d", "--dataset", required=True, help="dataset ID or name, e.g. 501 or Dataset501_Kvasir")
    p.add_argument("--encoder_weights", default=None, metavar="{imagenet,PATH}",
                   help="initialise the encoder from torchvision's ResNet-50 IMAGENET1K_V1 weights ('imagenet': "
                        "downloaded now into torch.hub's cache, $TORCH_HOME, unless already there; training only "
                        "reads the cache) or from a local ResNet-50 file (.pth): a torchvision or timm state dict, "
                        "a MoCo v2/v3, DINO or BYOL checkpoint, or nnUNetv2_meddisseg_pretrain's output (default: "
                        "random initialisation)")
    p.add_argument("--patch_size", nargs=2, type=int, metavar=("H", "W"), default=None,
                   help="patch size, multiples of 16 (default: nnU-Net's 2d patch size rounded up to a multiple of 16; "
                        "use 256 256 for the paper protocol on images resized to 256)")
    p.add_argument("--batch_size", type=int, default=None, help="samples per batch (default: from --gpu_memory_target)")
    p.add_argument("--gpu_memory_target", type=float, default=8.0, dest="memory_target_gb",
                   help="GiB of GPU memory the batch size is planned for (default 8, as nnU-Net)")
    p.add_argument("--memory_from", choices=("auto", "gpu", "estimate"), default="auto",
                   help="how the batch size's training memory is known: gpu = measured by two training steps on "
                        "this machine's CUDA GPU in the precision training uses; estimate = a per-pixel constant "
                        "measured on a CPU; auto (default) = gpu where CUDA is available")
    p.add_argument("--no_elat", dest="elat", action="store_false", help="ablation: no ELAT attention")
    p.add_argument("--activation", choices=("telu", "relu"), default="telu", help="activation of the network")
    p.add_argument("--no_cbat", dest="cbat", action="store_false",
                   help="ablation: each decoding path ends in a plain 3x3 conv-norm-activation block instead of CBAT")
    p.add_argument("--decoder_fusion", choices=("sum", "concat"), default="sum",
                   help="sum = paper Eq. 9; concat = released code / ConDSeg")
    p.add_argument("--added_norm", choices=tuple(ADDED_NORMS), default=DEFAULT_ADDED_NORM,
                   help="normalisation of the blocks Med-DisSeg adds to the ResNet-50 encoder (the encoder keeps "
                        "BatchNorm): instance (default) = per-image statistics, as nnU-Net's own networks; "
                        "batch = BatchNorm, the paper")
    p.add_argument("--recipe", default=None, metavar="FILE",
                   help="a JSON file of recipe settings ({\"num_epochs\": 100, ...}), written into the plans: every "
                        "run on them trains with these settings in place of its trainer's (default: none, the "
                        "trainer's own)")
    p.add_argument("--plans_name", default=DEFAULT_PLANS_NAME,
                   help="name of the plans file to write (<name>.json in the dataset's preprocessed folder)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing plans file of this name that holds other settings")
    p.add_argument("--source_plans", default="nnUNetPlans", dest="source_plans_name",
                   help="nnU-Net plans to derive from (their preprocessed 2d data is reused)")
    return p


def _plan_command(argv: Optional[Sequence[str]]) -> None:
    args = vars(_parser().parse_args(argv))
    dataset = args.pop("dataset")
    target = plan_meddisseg(dataset, **args)
    plans = json.loads(target.read_text())["configurations"]["2d"]
    print(f"wrote {target}\n  patch size {plans['patch_size']}, batch size {plans['batch_size']} "
          f"({plans['batch_size_source']}), "
          f"arch_kwargs {plans['architecture']['arch_kwargs']}")
    if plans["architecture"]["arch_kwargs"]["encoder_weights"] == "imagenet":
        from nnunetv2_meddisseg.blocks.encoder import imagenet_weights_file

        print(f"  encoder weights 'imagenet': torchvision's ResNet-50 IMAGENET1K_V1, {imagenet_weights_file()}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command("nnUNetv2_meddisseg_plan", _plan_command, argv)


if __name__ == "__main__":
    sys.exit(main())
