"""Parameters and FLOPs per image of Med-DisSeg and of the 2d networks nnU-Net plans for the same data.

``FlopCounterMode`` on the meta device, batch 1: convolutions and matrix products (2 FLOPs per multiply-add) of
the inference forward (eval, no deep supervision), the training forward (deep supervision and Med-DisSeg's
auxiliary heads) and the training forward + backward. Exits with 1 above 150 inference GFLOPs.
"""
from typing import Dict, Tuple

import torch
from common import (
    NNUNET_ARCHITECTURES,
    argument_parser,
    build_network,
    command_line,
    forward,
    machine_info,
    markdown_table,
    parameters,
    report,
    set_mode,
)
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

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
            outputs = tree_leaves(forward(net, x, training))
            leaves = [t for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
            sum(t.float().mean() for t in leaves).backward()
            net.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                forward(net, x, training)
    per_module = {k: int(sum(v.values())) for k, v in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


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
    p = argument_parser(__doc__, "params_flops")
    p.add_argument("--size", type=int, default=256, help="image height = width (RGB input, 2 classes)")
    args = p.parse_args(argv)

    # everything is built and run on the meta device: shapes only, nothing computed
    x = torch.empty(1, 3, args.size, args.size, device="meta")
    payload = {"machine": machine_info(), "command": command_line(), "size": args.size, "input_channels": 3,
               "num_classes": 2, "inference_target_gflops": INFERENCE_TARGET_GFLOPS, "networks": {}}

    # --- Med-DisSeg: parameters per top-level part, FLOPs per part
    net = _on_meta(lambda: build_network("MedDisSeg"))
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
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    concat = _on_meta(lambda: MedDisSegNet(3, 2, decoder_fusion="concat"))
    med["flops"]["inference_decoder_fusion_concat"] = count_flops(concat, x, training=False)[0]
    payload["networks"]["MedDisSeg"] = med

    # --- nnU-Net's networks
    for name in NNUNET_ARCHITECTURES:
        nnet = _on_meta(lambda: build_network(name))
        entry = {"plans": NNUNET_ARCHITECTURES[name]["plans"], "parameters_total": parameters(nnet),
                 "parameters_per_part": {n: parameters(m) for n, m in nnet.named_children()}, "flops": {}}
        for mode, kw in modes.items():
            entry["flops"][mode] = count_flops(nnet, x, **kw)[0]
        payload["networks"][name] = entry

    inference_g = med["flops"]["inference"] / GIGA
    payload["inference_target_met"] = inference_g <= INFERENCE_TARGET_GFLOPS
    missed = f"Med-DisSeg inference {inference_g:.1f} GFLOPs > {INFERENCE_TARGET_GFLOPS}"
    return report(args.out, "params_flops", payload, _markdown(payload, parts, detail_paths),
                  None if payload["inference_target_met"] else missed)


def _g(flops: int) -> str:
    return f"{flops / GIGA:.2f}"


def _m(n: int) -> str:
    return f"{n / 1e6:.3f}"


def _markdown(payload: dict, parts, detail_paths) -> str:
    nets = payload["networks"]
    med = nets["MedDisSeg"]
    size = payload["size"]
    modes = ("inference", "training_forward", "training_forward_backward")
    fwd = modes[:2]  # backward FLOPs are not attributed to parts
    out = [f"Input 1 x {payload['input_channels']} x {size} x {size}, {payload['num_classes']} classes. "
           "GFLOPs per image from `torch.utils.flop_counter.FlopCounterMode` (convolutions and matrix products, "
           "2 FLOPs per multiply-add; element-wise ops, norms, softmax, interpolation not counted).", "",
           "## Networks", ""]
    plain = nets["PlainConvUNet"]["flops"]["inference"]
    rows = [[name, _m(e["parameters_total"])] + [_g(e["flops"][m]) for m in modes]
            + [f"{e['flops']['inference'] / plain:.2f}"] for name, e in nets.items()]
    out.append(markdown_table(["network", "params (M)"] + [f"{m} GFLOPs" for m in modes]
                              + ["inference vs PlainConvUNet"], rows))
    target = payload["inference_target_gflops"]
    inf = med["flops"]["inference"] / GIGA
    out += ["", f"Med-DisSeg inference: **{inf:.1f} GFLOPs** per {size}x{size} image; target <= {target:.0f} "
            f"(at 256x256): **{'met' if payload['inference_target_met'] else 'MISSED'}**.", "",
            "## Med-DisSeg parts", ""]
    rows = [[part, _m(med["parameters_per_part"][part])] + [_g(med["flops_per_part"][m][part]) for m in fwd]
            for part in parts]
    rows.append(["**total**", _m(med["parameters_total"])] + [_g(med["flops"][m]) for m in fwd])
    out.append(markdown_table(["part", "params (M)"] + [f"{m} GFLOPs" for m in fwd], rows))
    out += ["", f"Parameters used only in training (auxiliary heads, uncertainty branch of the decoupling): "
            f"{_m(sum(med['parameters_training_only'].values()))} M; parameters used at inference: "
            f"{_m(med['parameters_inference'])} M.", "", "Details:", ""]
    rows = [[path] + [_g(med["flops_per_part"][m][path]) for m in fwd] for path in detail_paths]
    out.append(markdown_table(["module"] + [f"{m} GFLOPs" for m in fwd], rows))
    out += ["", "Variants (inference GFLOPs):", "",
            "- CDFA's window aggregation accumulates shifted views element-wise: not counted (about 50 FLOPs "
            "per channel and pixel)",
            f"- `decoder_fusion=\"concat\"` (released code: concatenation + full-resolution output block): "
            f"{_g(med['flops']['inference_decoder_fusion_concat'])}", ""]
    for name in ("PlainConvUNet", "ResEncM"):
        out.append(f"- {name}: built from {nets[name]['plans']} (arch_kwargs in benchmarks/common.py)")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
