"""Parameters and FLOPs per image of Med-DisSeg and of the 2d networks nnU-Net plans for the same data.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one image (batch 1): it counts
convolutions and matrix products (2 FLOPs per multiply-add), not element-wise operations,
normalisation, softmax or interpolation. Three passes per network:

- inference: eval mode, deep supervision off (what ``nnUNetv2_predict`` runs);
- training forward: train mode, deep supervision on (Med-DisSeg: auxiliary fg/bg/uc heads included);
- training forward + backward (the backward pass is counted too).

Usage: ``python benchmarks/params_flops.py [--size 256] [--out benchmarks/results]``
"""
import argparse
import sys
from typing import Dict, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode

from common import (DEFAULT_OUT, NNUNET_ARCHITECTURES, build_network, command_line, machine_info, markdown_table,
                    parameters, set_mode, write_results)

#: target for Med-DisSeg inference per 256x256 image
INFERENCE_TARGET_GFLOPS = 150.0
GIGA = 1e9


def count_flops(net: torch.nn.Module, x: torch.Tensor, training: bool, backward: bool = False
                ) -> Tuple[int, Dict[str, int]]:
    """(total FLOPs, FLOPs per module path) of one forward (and backward) pass.

    ``net`` and ``x`` may live on the meta device: nothing is computed then, only counted.
    """
    set_mode(net, training=training, deep_supervision=training)
    counter = FlopCounterMode(display=False, depth=None)
    with counter:
        if backward:
            out = net(x)
            sum(t.float().mean() for t in _flatten(out) if t.requires_grad).backward()
            net.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                net(x)
    per_module = {k: int(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def _flatten(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _flatten(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _flatten(v)


def _part_flops(per_module: Dict[str, int], path: str) -> int:
    """FLOPs of the module at ``path``; a container that is never called itself (ModuleList,
    ModuleDict) gets the sum over its direct children."""
    if path in per_module:
        return per_module[path]
    depth = path.count(".") + 1
    return sum(v for k, v in per_module.items() if k.startswith(path + ".") and k.count(".") == depth)


def _on_meta(build):
    with torch.device("meta"):
        return build()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="image height = width")
    p.add_argument("--channels", type=int, default=3, help="input channels (RGB: 3)")
    p.add_argument("--classes", type=int, default=2, help="output classes incl. background")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for params_flops.json / .md")
    args = p.parse_args(argv)

    # everything is built and run on the meta device: shapes only, nothing computed
    x = torch.empty(1, args.channels, args.size, args.size, device="meta")
    payload = {"machine": machine_info(), "command": command_line(), "size": args.size,
               "input_channels": args.channels, "num_classes": args.classes,
               "inference_target_gflops": INFERENCE_TARGET_GFLOPS, "networks": {}}

    # --- Med-DisSeg: parameters per top-level part, FLOPs per part
    net = _on_meta(lambda: build_network("MedDisSeg", args.channels, args.classes))
    parts = [name for name, _ in net.named_children()]
    params = {name: parameters(m) for name, m in net.named_children()}
    training_only = {"auxiliary_heads": params["auxiliary_heads"],
                     "decoupling.uc": parameters(net.decoupling.uc)}
    modes = {"inference": dict(training=False), "training_forward": dict(training=True),
             "training_forward_backward": dict(training=True, backward=True)}
    med = {"parameters_total": parameters(net), "parameters_per_part": params,
           "parameters_training_only": training_only,
           "parameters_inference": parameters(net) - sum(training_only.values()), "flops": {}, "flops_per_part": {}}
    detail_paths = ["cdfa.0", "cdfa.1", "cdfa.2", "cdfa.3", "decoder.small", "decoder.medium", "decoder.large",
                    "decoder.path_heads", "decoupling.uc", "enhancement.0"]
    for mode, kw in modes.items():
        total, per_module = count_flops(net, x, **kw)
        med["flops"][mode] = total
        if mode != "training_forward_backward":  # backward FLOPs are not attributed to modules reliably
            med["flops_per_part"][mode] = {part: _part_flops(per_module, f"MedDisSegNet.{part}")
                                           for part in parts + detail_paths}
    # the released code's fusion (concatenation + full-resolution output block) for comparison
    concat = _on_meta(lambda: _concat_fusion_network(args.channels, args.classes))
    med["flops"]["inference_decoder_fusion_concat"] = count_flops(concat, x, training=False)[0]
    payload["networks"]["MedDisSeg"] = med

    # --- nnU-Net's networks
    for name in NNUNET_ARCHITECTURES:
        nnet = _on_meta(lambda: build_network(name, args.channels, args.classes))
        entry = {"plans": NNUNET_ARCHITECTURES[name]["plans"], "parameters_total": parameters(nnet),
                 "parameters_per_part": {n: parameters(m) for n, m in nnet.named_children()}, "flops": {}}
        for mode, kw in modes.items():
            entry["flops"][mode] = count_flops(nnet, x, **kw)[0]
        payload["networks"][name] = entry

    inference_g = med["flops"]["inference"] / GIGA
    payload["inference_target_met"] = inference_g <= INFERENCE_TARGET_GFLOPS
    files = write_results(args.out, "params_flops", payload, _markdown(payload, parts, detail_paths))
    print(files["markdown"].read_text())
    print(f"written: {files['json']}, {files['markdown']}")
    if not payload["inference_target_met"]:
        print(f"TARGET MISSED: Med-DisSeg inference {inference_g:.1f} GFLOPs > {INFERENCE_TARGET_GFLOPS}",
              file=sys.stderr)
        return 1
    return 0


def _concat_fusion_network(channels: int, classes: int) -> torch.nn.Module:
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    return MedDisSegNet(channels, classes, decoder_fusion="concat")


def _g(flops: int) -> str:
    return f"{flops / GIGA:.2f}"


def _m(n: int) -> str:
    return f"{n / 1e6:.3f}"


def _markdown(payload: dict, parts, detail_paths) -> str:
    nets = payload["networks"]
    med = nets["MedDisSeg"]
    size = payload["size"]
    modes = [m for m in ("inference", "training_forward", "training_forward_backward") if m in med["flops"]]
    out = [f"Input 1 x {payload['input_channels']} x {size} x {size}, {payload['num_classes']} classes. "
           "GFLOPs per image from `torch.utils.flop_counter.FlopCounterMode` (convolutions and matrix products, "
           "2 FLOPs per multiply-add; element-wise ops, norms, softmax, interpolation not counted).", "",
           "## Networks", ""]
    rows = []
    for name, e in nets.items():
        rows.append([name, _m(e["parameters_total"])] + [_g(e["flops"][m]) for m in modes]
                    + [f"{e['flops']['inference'] / nets['PlainConvUNet']['flops']['inference']:.2f}"])
    out.append(markdown_table(["network", "params (M)"] + [f"{m} GFLOPs" for m in modes]
                              + ["inference vs PlainConvUNet"], rows))
    target = payload["inference_target_gflops"]
    inf = med["flops"]["inference"] / GIGA
    out += ["", f"Med-DisSeg inference: **{inf:.1f} GFLOPs** per {size}x{size} image; target <= {target:.0f} "
            f"(at 256x256): **{'met' if payload['inference_target_met'] else 'MISSED'}**.", "",
            "## Med-DisSeg parts", ""]
    rows = []
    fwd = [m for m in modes if m in med["flops_per_part"]]
    for part in parts:
        rows.append([part, _m(med["parameters_per_part"][part])]
                    + [_g(med["flops_per_part"][m][part]) for m in fwd])
    rows.append(["**total**", _m(med["parameters_total"])] + [_g(med["flops"][m]) for m in fwd])
    out.append(markdown_table(["part", "params (M)"] + [f"{m} GFLOPs" for m in fwd], rows))
    out += ["", f"Parameters used only in training (auxiliary heads, uncertainty branch of the decoupling): "
            f"{_m(sum(med['parameters_training_only'].values()))} M; parameters used at inference: "
            f"{_m(med['parameters_inference'])} M.", "", "Details:", ""]
    rows = [[path] + [_g(med["flops_per_part"][m][path]) for m in fwd] for path in detail_paths]
    out.append(markdown_table(["module"] + [f"{m} GFLOPs" for m in fwd], rows))
    out += ["", "Variants (inference GFLOPs):", "",
            f"- CDFA's window aggregation accumulates shifted views element-wise: not counted (about 50 FLOPs "
            f"per channel and pixel)",
            f"- `decoder_fusion=\"concat\"` (released code: concatenation + full-resolution output block): "
            f"{_g(med['flops']['inference_decoder_fusion_concat'])}", ""]
    for name in ("PlainConvUNet", "ResEncM"):
        out.append(f"- {name}: built from {nets[name]['plans']} (arch_kwargs in benchmarks/common.py)")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
