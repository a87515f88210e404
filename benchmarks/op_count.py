"""How many aten operations Med-DisSeg issues per training step and per inference forward.

On a GPU every aten operation is at least one kernel launch (a few microseconds of CPU time each in
eager mode), so the count, not the arithmetic, bounds a small network's speed there. The count does
not depend on the input size, and is measured here on the CPU with a ``TorchDispatchMode`` that sees
every aten operation dispatched (forward and backward; views included, listed apart).

Counted, on tiny batches (batch 2; 64x64 for Med-DisSeg, 128x128 for nnU-Net's network, whose seven
stages need it):

- ``stage2_step`` / ``stage1_step``: nnUNetTrainerMedDisSeg's forward, stage loss and backward;
- ``dispersive_step`` / ``default_step``: nnUNetTrainerDispersive / nnUNetTrainer on nnU-Net's default 2d
  network (PlainConvUNet), forward with deep supervision, loss, backward;
- ``*_train_step``: the trainers' whole ``train_step`` (gradient norms, clipping, the optimizer step with
  its multi-tensor kernels as on CUDA, the logged values; an epoch's second step);
- ``inference``: the inference forward of Med-DisSeg and PlainConvUNet; per module for Med-DisSeg.

Med-DisSeg's blocks choose their implementation by device (see ``blocks/device_forms.py``): the
count is taken with the few-op form forced (``--form few_op``, the default; ``cuda`` is an alias);
``--form shifted`` (alias ``cpu``) counts the shifted form, ``--form fused`` the Triton kernels (CUDA, or
``TRITON_INTERPRET=1``).

``--speed N`` also times, on the CPU, an inference forward at 256x256 and a training step at 128x128
(batch 2) of the blocks' CPU form vs their few-launch form in N alternating rounds (same weights): the
measurement behind the choice of form per device.

Usage: ``python benchmarks/op_count.py [--form few_op|shifted|fused] [--speed N] [--name op_count]``
"""
import argparse
import contextlib
import os
import sys
import tempfile
from collections import Counter
from copy import deepcopy
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nnunetv2_meddisseg.plans_entry import architecture_entry

from common import (DEFAULT_OUT, NNUNET_ARCHITECTURES, alternating_timings, command_line, machine_info, markdown_table,
                    summarize, write_results)

#: the two forms of the device-dependent blocks (``blocks/device_forms.py``)
FORMS = ("cpu", "cuda")
#: the parts of MedDisSegNet counted one by one in the training forward
MODULES = ("encoder", "elat.0", "elat.1", "elat.2", "elat.3", "enhancement.0", "enhancement.1", "enhancement.2",
           "enhancement.3", "decoupling", "guidance", "cdfa.0", "cdfa.1", "cdfa.2", "cdfa.3", "decoder",
           "auxiliary_heads")


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched inside it (``total``, ``by_op``), and per named module
    whose forward is running (``by_module``, inclusive of sub-modules), see :meth:`watch`."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.views = 0
        self.by_op: Counter = Counter()
        self.by_module: Counter = Counter()
        self._active: List[str] = []
        self._handles = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        if func.is_view:
            self.views += 1
        self.by_op[str(func.overloadpacket.__name__)] += 1
        for name in self._active:
            self.by_module[name] += 1
        return func(*args, **(kwargs or {}))

    def watch(self, root: nn.Module, names) -> "OpCounter":
        """Attribute the ops of each forward of ``root.get_submodule(name)`` to ``name``."""
        for name in names:
            module = root.get_submodule(name)
            self._handles.append(module.register_forward_pre_hook(lambda m, a, n=name: self._active.append(n)))
            self._handles.append(module.register_forward_hook(lambda m, a, o, n=name: self._active.remove(n)))
        return self

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def count(fn: Callable[[], object], watch: Optional[nn.Module] = None, names=()) -> OpCounter:
    counter = OpCounter()
    if watch is not None:
        counter.watch(watch, names)
    try:
        with counter:
            fn()
    finally:
        counter.remove_hooks()
    return counter


# ---------------------------------------------------------------------------------------- trainers
DATASET = "Dataset998_OpCount"
#: what ``nnUNetv2_meddisseg_plan --added-norm batch`` writes: the network the counts above measure
#: (``MedDisSegNet``'s defaults, BatchNorm everywhere)
MEDDISSEG_ARCH = architecture_entry(added_norm="batch")
DATASET_JSON = {"channel_names": {"0": "R", "1": "G", "2": "B"}, "labels": {"background": 0, "polyp": 1},
                "numTraining": 4, "file_ending": ".png"}


def plans(architecture: dict, size: int) -> dict:
    """nnU-Net plans of one 2d configuration (batch 2, patch size x size) building ``architecture``."""
    resampling = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    arch = {k: (list(v) if isinstance(v, tuple) else deepcopy(v)) for k, v in architecture.items() if k != "plans"}
    return {
        "dataset_name": DATASET, "plans_name": "nnUNetPlans", "original_median_spacing_after_transp": [999.0, 1.0, 1.0],
        "original_median_shape_after_transp": [1, size, size], "image_reader_writer": "NaturalImage2DIO",
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2], "experiment_planner_used": "ExperimentPlanner",
        "label_manager": "LabelManager", "foreground_intensity_properties_per_channel": {},
        "continue_training": False,
        "configurations": {"2d": {
            "data_identifier": "nnUNetPlans_2d", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
            "patch_size": [size, size], "median_image_size_in_voxels": [size, size], "spacing": [1.0, 1.0],
            "normalization_schemes": ["ZScoreNormalization"] * 3, "use_mask_for_norm": [False] * 3,
            "resampling_fn_data": "resample_data_or_seg_to_shape", "resampling_fn_seg": "resample_data_or_seg_to_shape",
            "resampling_fn_data_kwargs": resampling, "resampling_fn_seg_kwargs": resampling,
            "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
            "resampling_fn_probabilities_kwargs": resampling, "architecture": arch, "batch_dice": True,
        }},
    }


@contextlib.contextmanager
def nnunet_folders():
    """nnUNet_preprocessed / nnUNet_results in a temporary folder for the duration (trainers need them)."""
    saved = {k: os.environ.get(k) for k in ("nnUNet_preprocessed", "nnUNet_results")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "preprocessed" / DATASET / "nnUNetPlans_2d"
        folder.mkdir(parents=True)
        (folder / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
        os.environ["nnUNet_preprocessed"] = str(Path(tmp) / "preprocessed")
        os.environ["nnUNet_results"] = str(Path(tmp) / "results")
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def make_trainer(cls, plans_dict: dict):
    trainer = cls(plans=deepcopy(plans_dict), configuration="2d", fold=0, dataset_json=deepcopy(DATASET_JSON),
                  device=torch.device("cpu"))
    trainer.print_to_log_file = lambda *a, **k: None
    trainer.initialize()
    return trainer


def foreach_optimizer(trainer) -> None:
    """The optimizer's multi-tensor (foreach) kernels, which torch picks by default on CUDA only."""
    for group in trainer.optimizer.param_groups:
        group["foreach"] = True


def make_batch(size: int, deep_supervision_scales: int = 1, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    target = torch.zeros(2, 1, size, size)
    target[:, :, size // 8:size // 2, size // 4:3 * size // 4] = 1
    batch = {"data": torch.randn(2, 3, size, size, generator=g), "target": target, "keys": ["case_000", "case_001"]}
    if deep_supervision_scales > 1:
        batch["target"] = [target[:, :, ::2 ** i, ::2 ** i] for i in range(deep_supervision_scales)]
    return batch


def count_meddisseg(size: int = 64) -> Dict[str, dict]:
    """Stage II / Stage I steps, whole train_steps, inference and per-module counts of Med-DisSeg."""
    from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import STAGE_1, STAGE_2, nnUNetTrainerMedDisSeg

    results: Dict[str, dict] = {}
    trainer = make_trainer(nnUNetTrainerMedDisSeg, plans(MEDDISSEG_ARCH, size))
    network = trainer._plain_network()
    batch = make_batch(size)
    data, target = batch["data"], batch["target"]

    for stage in (STAGE_2, STAGE_1):
        trainer.optimizer, trainer.lr_scheduler = trainer.configure_optimizers(stage)
        network.train()
        losses = trainer._stage2_losses if stage == STAGE_2 else trainer._stage1_losses

        def step():
            trainer.optimizer.zero_grad(set_to_none=True)
            total, _, _ = losses(data, target)
            total.backward()

        step()  # first call: lazy initialisations out of the count
        names = MODULES if stage == STAGE_2 else ()
        results[f"{stage}_step"] = _summary(count(step, network, names))
        foreach_optimizer(trainer)
        trainer._diagnostics_due = True
        trainer.train_step(batch)  # the epoch's first step computes the diagnostics
        results[f"{stage}_train_step"] = _summary(count(lambda: trainer.train_step(batch)))

    network.encoder_only = False
    network.eval()
    network.decoder.deep_supervision = False
    with torch.no_grad():
        network(data)
        results["inference"] = _summary(count(lambda: network(data), network, MODULES))
    return results


def count_nnunet_default(size: int = 128) -> Dict[str, dict]:
    """nnU-Net's default 2d network under nnUNetTrainer and nnUNetTrainerDispersive; its inference."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive

    results: Dict[str, dict] = {}
    arch = NNUNET_ARCHITECTURES["PlainConvUNet"]
    p = plans(arch, size)
    for name, cls in (("default", nnUNetTrainer), ("dispersive", nnUNetTrainerDispersive)):
        trainer = make_trainer(cls, p)
        scales = len(trainer._get_deep_supervision_scales())
        batch = make_batch(size, scales)
        data, target = batch["data"], batch["target"]
        network = trainer.network

        def step():
            trainer.optimizer.zero_grad(set_to_none=True)
            if name == "default":
                total = trainer.loss(network(data), target)
            else:
                trainer._captured.clear()
                seg = trainer.loss(network(data), target)
                from nnunetv2_meddisseg.losses import dispersive_loss
                recipe = trainer.recipe
                total = seg + recipe.lambda_dispersive * dispersive_loss(
                    trainer._captured.pop(), recipe.dispersive_variant, recipe.dispersive_tau,
                    recipe.dispersive_eps, recipe.dispersive_margin)
            total.backward()

        step()
        results[f"{name}_step"] = _summary(count(step))
        foreach_optimizer(trainer)
        trainer.train_step(batch)
        results[f"{name}_train_step"] = _summary(count(lambda: trainer.train_step(batch)))
        if name == "default":
            network.eval()
            network.decoder.deep_supervision = False
            with torch.no_grad():
                network(data)
                results["inference_plain"] = _summary(count(lambda: network(data)))
    return results


def _summary(counter: OpCounter) -> dict:
    return {"ops": counter.total, "views": counter.views, "top_ops": dict(counter.by_op.most_common(12)),
            "by_module": dict(counter.by_module)}


ROWS = (("stage2_step", "Med-DisSeg Stage II step (forward + loss + backward)"),
        ("stage1_step", "Med-DisSeg Stage I step (forward + loss + backward)"),
        ("inference", "Med-DisSeg inference forward"),
        ("stage2_train_step", "Med-DisSeg Stage II whole train_step"),
        ("stage1_train_step", "Med-DisSeg Stage I whole train_step"),
        ("dispersive_step", "nnUNetTrainerDispersive step, PlainConvUNet (forward + loss + backward)"),
        ("default_step", "nnUNetTrainer step, PlainConvUNet (forward + loss + backward)"),
        ("dispersive_train_step", "nnUNetTrainerDispersive whole train_step"),
        ("default_train_step", "nnUNetTrainer whole train_step"),
        ("inference_plain", "PlainConvUNet inference forward"))


def cpu_speed(repeats: int, infer_size: int = 256, train_size: int = 128, batch: int = 2) -> dict:
    """Seconds of an inference forward at ``infer_size`` and of a training step (Stage II forward, loss,
    backward, Adam step) at ``train_size`` on the CPU, the blocks' CPU form (what the CPU runs) vs their
    few-launch form (what a GPU runs), same weights, in alternating rounds. Returns the median timings and
    the ratios few-launch / CPU form (> 1: the CPU form is the faster one on this CPU)."""
    from train_step import Stage2Loss, make_batch as train_batch, make_step
    from nnunetv2_meddisseg.architectures import MedDisSegNet
    from nnunetv2_meddisseg.blocks.device_forms import forced_form

    def in_form(form: str, fn: Callable[[], object]) -> Callable[[], object]:
        def run():
            with forced_form(form):
                return fn()
        return run

    torch.manual_seed(0)
    net = MedDisSegNet(3, 2).eval()
    net.decoder.deep_supervision = False
    x = torch.randn(batch, 3, infer_size, infer_size)

    def infer():
        with torch.inference_mode():
            return net(x)

    infer_times = alternating_timings({form: in_form(form, infer) for form in FORMS}, repeats)
    xt, target = train_batch(batch, train_size, torch.device("cpu"))
    steps = {}
    for form in FORMS:
        copy = deepcopy(net).train()
        copy.decoder.deep_supervision = True
        steps[form] = in_form(form, make_step(copy, Stage2Loss(dispersive=True), xt, target, amp=False))
    train_times = alternating_timings(steps, repeats)
    result = {"inference": {k: summarize(v) for k, v in infer_times.items()},
              "training_step": {k: summarize(v) for k, v in train_times.items()},
              "inference_size": infer_size, "training_size": train_size, "batch": batch, "repeats": repeats}
    for part in ("inference", "training_step"):
        result[f"{part}_ratio_cuda_form_over_cpu_form"] = (result[part]["cuda"]["median_s"]
                                                           / result[part]["cpu"]["median_s"])
    return result


def _markdown(payload: dict) -> str:
    r = payload["results"]
    lines = [f"Device form of the blocks counted: `{payload['form']}`", "",
             markdown_table(["what", "aten ops", "of which views"],
                            [[label, r[k]["ops"], r[k]["views"]] for k, label in ROWS if k in r]), "",
             "Per module, Stage II training forward / inference forward:", "",
             markdown_table(["module", "training forward", "inference forward"],
                            [[m, r["stage2_step"]["by_module"].get(m, 0), r["inference"]["by_module"].get(m, 0)]
                             for m in MODULES]), "",
             "Most frequent ops of the Stage II step: "
             + ", ".join(f"{k} {v}" for k, v in r["stage2_step"]["top_ops"].items())]
    speed = payload.get("cpu_speed")
    if speed:
        rows = []
        for part, label in (("inference", f"inference forward {speed['inference_size']}x{speed['inference_size']}"),
                            ("training_step", f"training step {speed['training_size']}x{speed['training_size']}")):
            rows.append([label, f"{speed[part]['cpu']['median_s']:.3f}", f"{speed[part]['cuda']['median_s']:.3f}",
                         f"{speed[f'{part}_ratio_cuda_form_over_cpu_form']:.3f}"])
        lines += ["", f"CPU speed of the blocks' two forms (batch {speed['batch']}, median of {speed['repeats']} "
                      f"alternating rounds; ratio > 1: the CPU form is faster here):", "",
                  markdown_table(["what", "CPU form s", "few-launch form s", "few-launch / CPU form"], rows)]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--form", choices=("fused", "shifted", "few_op", "cuda", "cpu"), default="few_op",
                   help="implementation form of the device-dependent blocks to count")
    p.add_argument("--speed", type=int, default=0, metavar="ROUNDS",
                   help="also time the blocks' CPU form vs their few-launch form on the CPU in ROUNDS alternating rounds")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the timings")
    p.add_argument("--name", default="op_count", help="results file name (without extension)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for <name>.json / .md")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    from nnunetv2_meddisseg.blocks import device_forms

    with nnunet_folders(), device_forms.forced_form(args.form):
        results = count_meddisseg()
        results.update(count_nnunet_default())
    payload = {"machine": machine_info("cpu"), "command": command_line(), "form": args.form, "results": results}
    if args.speed:
        payload["cpu_speed"] = cpu_speed(args.speed)
    files = write_results(Path(args.out), args.name, payload, _markdown(payload))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
