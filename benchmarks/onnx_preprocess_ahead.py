"""The ONNX predictor with and without the next case preprocessed ahead, side by side in one run.

``OnnxPredictor.predict_folder`` reads and preprocesses case i+1 in a background thread while case i is predicted
(``preprocess_ahead``, the default; ``--sequential`` turns it off). This script times both paths on the same images
and threads, alternating in rounds (medians), for two models at the ends of the range: nnU-Net's default 2D network
(``PlainConvUNet`` as nnU-Net plans it for 256x256 RGB data, untrained) on 256x256 images, where the network's time
dominates, and a two-layer network on 1024x768 images (one tile), where reading and preprocessing the images is a
large part.
Per model it also times the parts alone (reading + preprocessing a case, predicting one, sequentially), so that the
gain can be read against its bound: the preprocessing time hidden behind prediction. Both paths write the same
masks (checked here). Writes ``onnx_preprocess_ahead.json`` / ``.md`` (with every round's seconds).
"""
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from common import (
    alternating_timings,
    argument_parser,
    build_network,
    command_line,
    machine_info,
    markdown_table,
    package_version,
    report,
    summarize,
)
from PIL import Image
from torch import nn

MODELS = {
    # name: (network, patch, image (height, width))
    "nnU-Net default (PlainConvUNet)": (lambda: build_network("PlainConvUNet"), (256, 256), (256, 256)),
    "two-layer network": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 1)),
                          (1024, 768), (1024, 768)),
}


def _export(folder: Path, network: nn.Module, patch) -> None:
    """``network`` (3 -> 2 channels) as a one-fold export folder the predictor reads."""
    from nnunetv2_meddisseg.deploy.description import (
        FORMAT_VERSION,
        WRITTEN_BY,
        fold_model_file,
        sha256_of,
        validate_description,
    )
    from nnunetv2_meddisseg.deploy.export import trace_to_onnx
    from nnunetv2_meddisseg.deploy.export_folder import write_export

    graph = trace_to_onnx(network.eval(), torch.zeros(1, 3, *patch))
    description = {
        "format_version": FORMAT_VERSION, "written_by": WRITTEN_BY, "trainer": "benchmark", "plans": "none",
        "configuration": "2d", "checkpoint": "none",
        "folds": [{"fold": "0", "file": fold_model_file(0), "sha256": sha256_of(graph), "checks": []}],
        "patch_size": list(patch), "num_input_channels": 3, "num_segmentation_heads": 2,
        "normalization": [{"scheme": "ZScoreNormalization", "use_mask_for_norm": False,
                           "intensity_properties": {}}] * 3,
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2], "file_ending": ".png",
        "labels": {"background": 0, "foreground": 1}, "regions_class_order": None, "mirror_axes": [0, 1],
        "tile_step_size": 0.5}
    validate_description(description, folder)
    write_export(folder, {"0": graph}, description)


def _images(folder: Path, shape, count: int, seed: int = 0) -> None:
    """``count`` RGB PNGs of smooth random content (PNG-compressible, as photographs are) framed in black."""
    from scipy.ndimage import gaussian_filter

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        image = gaussian_filter(rng.random((*shape, 3)), (8, 8, 0)) * 255
        image = np.clip((image - image.min()) / np.ptp(image) * 255, 0, 255).astype(np.uint8)
        image[:8], image[:, -8:] = 0, 0
        Image.fromarray(image).save(folder / f"case{i:03d}_0000.png")


def _parts(predictor, images: Path) -> dict:
    """Seconds per case of reading + preprocessing and of predicting (logits, mask), each alone."""
    from nnunetv2_meddisseg.deploy.predict_onnx import find_cases

    prepare, predict = [], []
    for files in find_cases(images, ".png").values():
        start = time.perf_counter()
        prepared = predictor.prepare(files)
        prepare.append(time.perf_counter() - start)
        start = time.perf_counter()
        predictor.predict_prepared(prepared)
        predict.append(time.perf_counter() - start)
    return {"prepare_s_per_case": float(np.median(prepare)), "predict_s_per_case": float(np.median(predict))}


def _run(args, work: Path) -> dict:
    from nnunetv2_meddisseg.deploy.predict_onnx import OnnxPredictor

    results = {}
    for name, (make, patch, shape) in MODELS.items():
        key = name.split(" ")[0].lower()
        torch.manual_seed(0)
        _export(work / key / "model", make(), patch)
        images = work / key / "images"
        _images(images, shape, args.num_images)
        predictor = OnnxPredictor(work / key / "model", use_mirroring=False, threads=args.threads)
        outputs = {"sequential": work / key / "sequential", "ahead": work / key / "ahead"}
        calls = {arm: (lambda o=out, a=(arm == "ahead"): predictor.predict_folder(images, o, preprocess_ahead=a))
                 for arm, out in outputs.items()}
        print(f"{name}: {args.num_images} images of {shape[0]}x{shape[1]}, patch {patch[0]}x{patch[1]}, TTA off")
        times = alternating_timings(calls, repeats=args.repeats, warmup=1)
        masks = [{p.name: p.read_bytes() for p in sorted(o.glob("*.png"))} for o in outputs.values()]
        record = {"images": args.num_images, "image_shape": list(shape), "patch": list(patch),
                  "identical_masks": masks[0] == masks[1] and len(masks[0]) == args.num_images,
                  **_parts(predictor, images)}
        for arm, samples in times.items():
            record[arm] = {**summarize(samples), "images_per_s": args.num_images / summarize(samples)["median_s"]}
        record["speedup"] = record["sequential"]["median_s"] / record["ahead"]["median_s"]
        # each round times both paths back to back: the ratio within a round is the least disturbed by the load
        paired = sorted(s / a for s, a in zip(times["sequential"], times["ahead"]))
        record["samples_s"] = times
        record["paired_speedup"] = {"median": float(np.median(paired)), "min": paired[0], "max": paired[-1]}
        bound = record["prepare_s_per_case"] + record["predict_s_per_case"]
        record["speedup_bound"] = bound / max(record["prepare_s_per_case"], record["predict_s_per_case"])
        print(f"  sequential {record['sequential']['images_per_s']:.2f} images/s, ahead "
              f"{record['ahead']['images_per_s']:.2f} images/s: {record['speedup']:.2f}x, per round "
              f"{record['paired_speedup']['median']:.2f}x ({paired[0]:.2f}-{paired[-1]:.2f}) "
              f"(bound {record['speedup_bound']:.2f}x; masks identical: {record['identical_masks']})")
        results[name] = record
    return results


def _markdown(payload: dict) -> str:
    rows = []
    for name, r in payload["results"].items():
        rows.append([name, f"{r['image_shape'][0]}x{r['image_shape'][1]}", f"{r['prepare_s_per_case'] * 1e3:.0f}",
                     f"{r['predict_s_per_case'] * 1e3:.0f}", f"{r['sequential']['images_per_s']:.2f}",
                     f"{r['ahead']['images_per_s']:.2f}", f"{r['speedup']:.2f}x",
                     f"{r['paired_speedup']['median']:.2f}x ({r['paired_speedup']['min']:.2f}-"
                     f"{r['paired_speedup']['max']:.2f})", f"{r['speedup_bound']:.2f}x",
                     "yes" if r["identical_masks"] else "NO"])
    headers = ["model", "images", "read + preprocess ms/case", "predict ms/case", "sequential images/s",
               "ahead images/s", "speed-up", "per round: median (range)", "bound", "identical masks"]
    return "\n".join([f"{payload['threads']} ONNX Runtime threads, TTA off, {payload['repeats']} timed rounds after "
                      f"one untimed (medians); onnxruntime {payload['onnxruntime']}.", "",
                      markdown_table(headers, rows), "",
                      "Speed-up: the ratio of the medians; per round: sequential / ahead within each round (both "
                      "back to back), the least disturbed by other load. The bound is (preprocess + predict) / "
                      "max(preprocess, predict): every preprocessing second hidden behind prediction, with nothing "
                      "else competing for the cores."])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argument_parser(__doc__, "onnx_preprocess_ahead")
    p.add_argument("--num-images", type=int, default=8, help="images per model")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime's intra-op threads")
    p.add_argument("--work", default=None, help="work folder (default: a temporary folder, removed at the end)")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_ahead_")).resolve()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    machine = machine_info("cpu")
    try:
        results = _run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    payload = {"machine": {**machine, "load_average_after": machine_info("cpu")["load_average_1_5_15min"]},
               "command": command_line(), "onnxruntime": package_version("onnxruntime"), "threads": args.threads,
               "repeats": args.repeats, "results": results}
    return report(Path(args.out), "onnx_preprocess_ahead", payload, _markdown(payload))


if __name__ == "__main__":
    raise SystemExit(main())
