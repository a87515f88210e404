"""Mixed-precision probe: train Med-DisSeg's network under nnU-Net's CUDA AMP recipe and find what
overflows.

nnU-Net trains on CUDA under ``torch.autocast`` (fp16) with a ``GradScaler``: the loss is multiplied
by the scale (65536 at the start, halved after every step with a non-finite gradient, doubled after
2000 finite steps), gradients are unscaled, clipped at 12, and the optimizer step is skipped when
they are not finite. If a forward pass overflows fp16 at every step, every step is skipped, the
scale halves until all gradients underflow to zero and training stops for good. This script runs
that recipe (or fp32, or bf16 autocast without a scaler) in a plain loop on Kvasir-SEG images,
on a GPU or the CPU, and records per step the loss, the scale, the
gradient norm and whether the step was taken; every ``--stats-every`` steps the largest forward
output and the largest (unscaled) gradient of every module; and at each of the first non-finite
steps, a diagnosis on a copy of the network: the first module (in execution order) whose forward
output is not finite, or else the module nearest the loss whose output gradient is not finite.

On the CPU, fp16 convolution backward passes run on a reference kernel (about 100x slower than
fp32), so ``--precision fp16-range`` emulates the recipe instead: fp32 arithmetic, the GradScaler's
rule applied by hand, and a step counted as overflowing when any module's output, or any module
output's scaled gradient, exceeds fp16's largest value (65504). It finds what leaves fp16's range,
not rounding effects.

Training is the bare network (Dice + CE on the final logits, nnU-Net's ``DC_and_CE_loss``), images
z-scored per image and channel (nnU-Net's normalisation for RGB), random flips and 90-degree
rotations, Adam or SGD (Nesterov, momentum 0.99) as in the from-scratch study's recipes.

Usage: ``python benchmarks/amp_probe.py [--size 32] [--batch 8] [--steps 300] [--optimizer adam]
[--lr 1e-3] [--precision fp16|bf16|fp32] [--device cpu] [--threads 1]``; writes NAME.json / NAME.md.
"""
import argparse
import copy
import math
import os
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from common import DEFAULT_OUT, command_line, machine_info, markdown_table, parse_device, write_results
from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.datasets.split_lists import load_shipped_split

DATA_VARIABLE = "NNUNETV2_MEDDISSEG_TEST_DATA"
FP16_MAX = float(torch.finfo(torch.float16).max)
PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp16-range": None}


# ------------------------------------------------------------------------------------------------
# data


def load_kvasir(folder: Path, size: int, max_cases: Optional[int]) -> Tuple[Tensor, Tensor]:
    """The shipped training list of Kvasir-SEG: images (N, 3, size, size) z-scored per image and
    channel, masks (N, 1, size, size) in {0, 1}."""
    ids = load_shipped_split("kvasir_seg.json")["train"][:max_cases]
    images, masks = [], []
    for case in ids:
        img = Image.open(folder / "images" / f"{case}.jpg").convert("RGB").resize((size, size), Image.BILINEAR)
        msk = Image.open(folder / "masks" / f"{case}.jpg").convert("L").resize((size, size), Image.NEAREST)
        a = np.asarray(img, dtype=np.float32).transpose(2, 0, 1)
        a = (a - a.mean(axis=(1, 2), keepdims=True)) / (a.std(axis=(1, 2), keepdims=True) + 1e-8)
        images.append(a)
        masks.append((np.asarray(msk) > 127).astype(np.float32)[None])
    return torch.from_numpy(np.stack(images)), torch.from_numpy(np.stack(masks))


def sample_batch(images: Tensor, masks: Tensor, batch: int, gen: torch.Generator) -> Tuple[Tensor, Tensor]:
    """``batch`` random cases, each flipped and rotated by a random multiple of 90 degrees."""
    idx = torch.randint(len(images), (batch,), generator=gen)
    xs, ys = [], []
    for i in idx.tolist():
        x, y = images[i], masks[i]
        k, flip = int(torch.randint(4, (1,), generator=gen)), bool(torch.randint(2, (1,), generator=gen))
        x, y = torch.rot90(x, k, (1, 2)), torch.rot90(y, k, (1, 2))
        if flip:
            x, y = x.flip(2), y.flip(2)
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


# ------------------------------------------------------------------------------------------------
# hooks


def _tensors(out) -> List[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for name in out.__dataclass_fields__ for t in _tensors(getattr(out, name))]
    return []


class ModuleMonitor:
    """Forward hooks on every named module: the largest |output| per module (fp32) and, through
    tensor hooks, the largest |gradient| of that output; the execution order of the modules."""

    def __init__(self, net: nn.Module) -> None:
        self.forward_max: Dict[str, float] = {}
        self.grad_max: Dict[str, float] = {}
        self.order: List[str] = []
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in net.named_modules() if name]

    def _hook(self, name: str):
        def hook(module, inputs, output):
            tensors = [t for t in _tensors(output) if t.is_floating_point()]
            if not tensors:
                return
            self.order.append(name)
            self.forward_max[name] = max(t.detach().abs().amax().float().item() for t in tensors)
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(self._grad_hook(name))
        return hook

    def _grad_hook(self, name: str):
        def hook(grad):
            value = grad.detach().abs().amax().float().item()
            self.grad_max[name] = max(self.grad_max.get(name, 0.0), value)
        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def top(values: Dict[str, float], n: int) -> List[Tuple[str, float]]:
    return sorted(values.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else -math.inf)[:n]


# ------------------------------------------------------------------------------------------------
# training


class RangeScaler:
    """``torch.amp.GradScaler``'s rule (initial scale 2**16, x0.5 on overflow, x2 after 2000 good
    steps) for fp32 training in which "overflow" means leaving fp16's range."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_interval: int = 2000) -> None:
        self.scale, self.growth_interval, self.good_steps = init_scale, growth_interval, 0

    def overflowed(self, monitor: "ModuleMonitor") -> Optional[str]:
        """The module whose output (forward) or scaled output gradient left fp16's range, or None."""
        for name in monitor.order:
            if monitor.forward_max.get(name, 0.0) > FP16_MAX:
                return f"forward: {name}"
        worst = top(monitor.grad_max, 1)
        if worst and worst[0][1] > FP16_MAX:
            return f"gradient: {worst[0][0]}"
        return None

    def update(self, overflow: bool) -> None:
        if overflow:
            self.scale, self.good_steps = self.scale * 0.5, 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale, self.good_steps = self.scale * 2.0, 0


def build_network() -> nn.Module:
    """Med-DisSeg's network as ``nnUNetTrainerMedDisSeg`` builds it for RGB input, two classes."""
    return MedDisSegNet(3, 2, deep_supervision=False)


def make_optimizer(net: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(net.parameters(), lr=lr)
    return torch.optim.SGD(net.parameters(), lr=lr, momentum=0.99, nesterov=True, weight_decay=3e-5)


def make_loss():
    from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
    from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss

    return DC_and_CE_loss({"batch_dice": True, "smooth": 1e-5, "do_bg": False, "ddp": False}, {}, weight_ce=1,
                          weight_dice=1, ignore_label=None, dice_class=MemoryEfficientSoftDiceLoss)


def diagnose(net: nn.Module, loss_fn, x: Tensor, y: Tensor, dtype, scale: float) -> dict:
    """Forward and backward of one batch on a copy of ``net`` with every module monitored."""
    probe = copy.deepcopy(net)
    monitor = ModuleMonitor(probe)
    with torch.autocast(x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = loss_fn(probe(x), y)
    result = {"loss": float(loss.detach().float())}
    bad_forward = [n for n in monitor.order if not math.isfinite(monitor.forward_max[n])]
    if bad_forward:
        first = bad_forward[0]
        i = monitor.order.index(first)
        result["first_nonfinite_forward"] = first
        result["before_it"] = [(n, monitor.forward_max[n]) for n in monitor.order[max(0, i - 3):i]]
    (loss * scale).backward()
    bad_grad = [n for n in reversed(monitor.order) if n in monitor.grad_max and not math.isfinite(monitor.grad_max[n])]
    if bad_grad:
        result["first_nonfinite_gradient"] = bad_grad[0]
        result["nonfinite_gradient_modules"] = len(bad_grad)
    result["nonfinite_parameter_grads"] = [n for n, p in probe.named_parameters()
                                           if p.grad is not None and not torch.isfinite(p.grad).all()][:10]
    result["largest_forward"] = top(monitor.forward_max, 5)
    result["largest_gradient_unscaled"] = [(n, v / scale) for n, v in top(monitor.grad_max, 5)]
    monitor.remove()
    return result


def train(args, save=None) -> dict:
    """The loop; ``save(run)`` (if given) is called with the figures so far after every statistics step,
    so that a run cut short keeps what it measured."""
    device = parse_device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    images, masks = load_kvasir(Path(args.kvasir), args.size, args.max_cases)
    net = build_network().to(device).train()
    opt = make_optimizer(net, args.optimizer, args.lr)
    loss_fn = make_loss()
    dtype = PRECISIONS[args.precision]
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
    emulated = RangeScaler() if args.precision == "fp16-range" else None
    steps, stats, diagnoses = [], [], []
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = (t.to(device) for t in sample_batch(images, masks, args.batch, gen))
        scale = scaler.get_scale() if scaler else emulated.scale if emulated else 1.0
        monitor = ModuleMonitor(net) if emulated or step % args.stats_every == 0 else None
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(net(x), y)
        cause = None
        if scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        elif emulated:
            (loss * scale).backward()
            cause = emulated.overflowed(monitor)
            for p in net.parameters():
                if p.grad is not None:
                    p.grad.div_(scale)
        else:
            loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(net.parameters(), 12))
        taken = math.isfinite(norm) and cause is None
        if scaler:
            scaler.step(opt)
            scaler.update()
        elif emulated:
            if taken:
                opt.step()
            emulated.update(not taken)
        else:
            opt.step()
        steps.append({"step": step, "loss": float(loss.detach().float()), "scale": scale, "grad_norm": norm,
                      "taken": taken, **({"overflow": cause} if cause else {})})
        if monitor is not None:
            if step % args.stats_every == 0:
                stats.append({"step": step, "largest_forward": top(monitor.forward_max, 3),
                              "largest_gradient_unscaled": [(n, v / scale) for n, v in top(monitor.grad_max, 3)]})
                if save is not None:
                    save(_run_summary(steps, stats, diagnoses, time.perf_counter() - start))
            monitor.remove()
        if not taken and not emulated and len(diagnoses) < args.diagnoses:
            diagnoses.append({"step": step, "scale": scale, **diagnose(net, loss_fn, x, y, dtype, scale)})
        if step % args.print_every == 0 or not taken:
            print(f"step {step:4d}  loss {steps[-1]['loss']:8.4f}  scale {scale:9.3g}  grad norm {norm:10.4g}"
                  f"{'' if taken else '  (skipped' + (': ' + cause if cause else '') + ')'}  "
                  f"{time.perf_counter() - start:6.0f} s", flush=True)
    return _run_summary(steps, stats, diagnoses, time.perf_counter() - start)


def _run_summary(steps: List[dict], stats: List[dict], diagnoses: List[dict], wall_s: float) -> dict:
    return {"steps": steps, "stats": stats, "diagnoses": diagnoses,
            "skipped_steps": [s["step"] for s in steps if not s["taken"]], "wall_s": wall_s}


# ------------------------------------------------------------------------------------------------
# report


def _fmt(pairs) -> str:
    return "; ".join(f"{n} {v:.3g}" for n, v in pairs)


def report(args, run: dict) -> str:
    steps = run["steps"]
    lines = [f"{args.precision}, {args.optimizer} lr {args.lr}, {args.size}x{args.size}, batch {args.batch}, "
             f"{len(steps)} of {args.steps} steps, seed {args.seed}; {run['wall_s'] / 60:.1f} min", ""]
    skipped = run["skipped_steps"]
    lines.append(f"Skipped steps (non-finite gradient): {len(skipped)}"
                 + (f", first at step {skipped[0]}, last at {skipped[-1]}" if skipped else "")
                 + f"; final scale {steps[-1]['scale']:.3g}.")
    causes: Dict[str, int] = {}
    for s in steps:
        if "overflow" in s:
            causes[s["overflow"]] = causes.get(s["overflow"], 0) + 1
    if causes:
        lines.append("Overflow causes (steps): " + "; ".join(f"`{c}` {n}" for c, n in sorted(causes.items(),
                                                                                        key=lambda kv: -kv[1])) + ".")
    lines += ["", "Every " + str(args.stats_every) + " steps, the largest module outputs (forward) and unscaled "
              "output gradients (fp16 holds at most 65504; the scaled gradient is the unscaled one times the scale):",
              ""]
    rows = [[s["step"], f"{steps[s['step']]['loss']:.3f}", f"{steps[s['step']]['scale']:.3g}",
             f"{steps[s['step']]['grad_norm']:.3g}", _fmt(s["largest_forward"]), _fmt(s["largest_gradient_unscaled"])]
            for s in run["stats"]]
    lines.append(markdown_table(["step", "loss", "scale", "grad norm", "largest forward", "largest gradient"], rows))
    if run["diagnoses"]:
        lines += ["", "Diagnoses of the first non-finite steps:", ""]
        for d in run["diagnoses"]:
            where = d.get("first_nonfinite_forward")
            text = (f"forward overflow first in `{where}` (preceded by {_fmt(d['before_it'])})" if where else
                    f"forward finite; first non-finite gradient at `{d.get('first_nonfinite_gradient')}` "
                    f"({d.get('nonfinite_gradient_modules', 0)} modules)")
            lines.append(f"- step {d['step']} (scale {d['scale']:.3g}): {text}; largest forward: "
                         f"{_fmt(d['largest_forward'])}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    root = os.environ.get(DATA_VARIABLE)
    p.add_argument("--kvasir", default=str(Path(root) / "Kvasir-SEG") if root else None,
                   help=f"Kvasir-SEG folder (images/, masks/) (default: ${DATA_VARIABLE}/Kvasir-SEG)")
    p.add_argument("--size", type=int, default=32, help="images resized to SIZE x SIZE (a multiple of 16)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--max-cases", type=int, default=None, help="only the first N training cases")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp16",
                   help="fp16: autocast + GradScaler (nnU-Net's CUDA recipe); fp16-range: its emulation in fp32 "
                        "(see above); bf16: autocast only; fp32: none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats-every", type=int, default=25, help="steps between module statistics")
    p.add_argument("--diagnoses", type=int, default=3, help="non-finite steps diagnosed (the first N)")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument("--name", default="amp_probe")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not args.kvasir or not Path(args.kvasir, "images").is_dir():
        raise SystemExit(f"amp_probe: error: Kvasir-SEG not found: pass --kvasir or set {DATA_VARIABLE}")
    if args.size % 16:
        raise SystemExit(f"amp_probe: error: --size must be a multiple of 16, got {args.size}")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine, command = machine_info(args.device), command_line()

    def save(run: dict) -> Dict[str, Path]:
        payload = {"machine": machine, "command": command, "arguments": vars(args), **run}
        return write_results(Path(args.out), args.name, payload, report(args, run))

    run = train(args, save)
    paths = save(run)
    print(report(args, run))
    print(f"wrote {paths['json']} and {paths['markdown']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
