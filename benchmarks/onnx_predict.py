"""Images per second of nnU-Net's predictor (PyTorch) and the ONNX Runtime predictor on the same images and threads,
side by side in one run, for Med-DisSeg and default nnU-Net; with the agreement of their masks and the export's
cost, and how each CDFA form exports.

Both predictors run in this process after loading their model: nnU-Net's ``nnUNetPredictor`` as
``nnUNetv2_predict -npp 0 -nps 0`` runs it (``predict_from_files_sequential``: read, preprocess, sliding window,
export the masks), and ``nnunetv2_meddisseg.deploy.predict_onnx.OnnxPredictor.predict_folder`` (the same steps in
numpy and ONNX Runtime), on a folder of N generated images, alternating in rounds, medians reported; with and
without mirroring. ``--device cuda`` runs nnU-Net's predictor on the GPU and ONNX Runtime through its TensorRT and
CUDA providers (``--providers``; each provider one arm, a provider this onnxruntime lacks named and left out;
TensorRT's engines cached in the work folder, their build in the "sessions + first round" seconds). The models are
the untrained, BatchNorm-calibrated model folders ``predict.py`` builds
(prediction time does not depend on the weights), exported with ``nnUNetv2_meddisseg_export``. The export forms
part traces ``MedDisSegNet(3, 2)`` with each CDFA form (legacy TorchScript exporter) and compares ONNX Runtime with
PyTorch on one 64x64 input.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from common import (
    alternating_timings,
    argument_parser,
    command_line,
    machine_info,
    markdown_table,
    package_version,
    report,
    summarize,
)

CONFIGURATION = "2d"


def _dynamo_export(net, x) -> bytes:
    """The graph form exported by torch.onnx.export(dynamo=True) (needs onnxscript)."""
    import torch

    from nnunetv2_meddisseg.blocks.device_forms import forced_form

    dim = {2: torch.export.Dim("height", min=32, max=4096), 3: torch.export.Dim("width", min=32, max=4096)}
    with forced_form("graph"), torch.no_grad():
        program = torch.onnx.export(net, (x,), input_names=["image"], output_names=["logits"], opset_version=18,
                                    dynamo=True, dynamic_shapes=(dim,))
    return program.model_proto.SerializeToString()


def _export_forms(dynamo: bool, size: int = 64) -> List[dict]:
    """Each CDFA form of MedDisSegNet(3, 2) traced by torch.onnx.export(dynamo=False) (and with ``dynamo`` the graph
    form by dynamo=True): seconds, operators (Constant nodes left out), ScatterND / Col2Im nodes and ONNX Runtime
    against PyTorch on one input, or the error."""
    import onnx
    import onnxruntime as ort
    import torch

    from nnunetv2_meddisseg.architectures import MedDisSegNet
    from nnunetv2_meddisseg.deploy.export import trace_to_onnx

    torch.manual_seed(0)
    net = MedDisSegNet(3, 2).eval()
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        expected = net(x).numpy()
    rows = []
    for form in ("shifted", "few_op", "graph") + (("graph, dynamo=True",) if dynamo else ()):
        row = {"form": form}
        start = time.perf_counter()
        try:
            model = _dynamo_export(net, x) if "dynamo" in form else trace_to_onnx(net, x, form)
        except Exception as e:  # the exporter's own failure is the figure here
            row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
            rows.append(row)
            continue
        row["export_s"] = time.perf_counter() - start
        ops = Counter(n.op_type for n in onnx.load_from_string(model).graph.node)
        row["operators"] = sum(n for op, n in ops.items() if op != "Constant")
        row["scatter_col2im"] = ops.get("ScatterND", 0) + ops.get("Col2Im", 0)
        got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"image": x.numpy()})[0]
        row["max_abs_logit"] = float(np.abs(expected).max())
        row["max_abs_difference"] = float(np.abs(got - expected).max())
        rows.append(row)
        print(f"export form {form}: {row}")
    return rows


def _agreement(nnunet_dir: Path, onnx_dir: Path, cases: Sequence[str], ending: str) -> dict:
    """Per-case Dice of the foreground of both predictors' masks and the largest probability difference."""
    from PIL import Image

    dice, largest = [], 0.0
    for case in cases:
        a, b = (np.asarray(Image.open(d / f"{case}{ending}")) > 0 for d in (nnunet_dir, onnx_dir))
        both = a.sum() + b.sum()
        dice.append(1.0 if both == 0 else float(2 * (a & b).sum() / both))
        p, q = (np.load(d / f"{case}.npz")["probabilities"] for d in (nnunet_dir, onnx_dir))
        largest = max(largest, float(np.abs(p - q).max()))
    return {"min_dice": min(dice), "identical_masks": sum(d == 1.0 for d in dice), "cases": len(dice),
            "max_probability_difference": largest}


#: ONNX Runtime's providers in the order a session falls back through them
PROVIDER_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def provider_arms(requested: Sequence[str], available: Sequence[str]) -> Tuple[Dict[str, List[str]], Dict[str, str]]:
    """The ONNX Runtime arms to time: ``({arm: the session's providers}, {provider: why it is left out})``.

    Each requested provider is one arm named by it without ``ExecutionProvider``; its sessions fall back through the
    available providers after it in :data:`PROVIDER_ORDER` (TensorRT -> CUDA -> CPU), as ONNX Runtime advises. A
    provider this onnxruntime does not have is left out with the reason."""
    arms, left_out = {}, {}
    for provider in requested:
        if provider not in available:
            left_out[provider] = f"not in this onnxruntime (available: {', '.join(available)})"
            continue
        after = PROVIDER_ORDER[PROVIDER_ORDER.index(provider) + 1:] if provider in PROVIDER_ORDER else ()
        arms[provider.replace("ExecutionProvider", "")] = [provider] + [p for p in after if p in available]
    return arms, left_out


def _session_providers(providers: Sequence[str], cache: Path) -> List[object]:
    """Provider entries for a session: TensorRT with an engine cache in ``cache`` (engines are built once per
    input shape, not once per session)."""
    return [(p, {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache)})
            if p == "TensorrtExecutionProvider" else p for p in providers]


def start_arm(model_dir: Path, providers: Sequence[object], use_mirroring: bool, threads: int, images: Path,
              out: Path, reference: Path, cases: Sequence[str], ending: str) -> Tuple[Optional[object], dict]:
    """One ONNX Runtime arm of one model: ``(its predictor, its record)`` after a first round, timed together with
    the sessions' creation (TensorRT builds its engines there), and the masks' agreement with nnU-Net's in
    ``reference``; ``(None, {"error": ...})`` where the arm cannot run here (ONNX Runtime can list a provider whose
    libraries are missing), so that the other arms are still measured."""
    from nnunetv2_meddisseg.deploy.predict_onnx import OnnxPredictor

    start = time.perf_counter()
    try:
        predictor = OnnxPredictor(model_dir, use_mirroring=use_mirroring, threads=threads, providers=providers)
        predictor.predict_folder(images, out)
    except Exception as e:  # the provider's own failure is the result here
        return None, {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    first_s = time.perf_counter() - start
    predictor.predict_folder(images, out, save_probabilities=True)  # for the agreement, untimed
    return predictor, {**_agreement(reference, out, cases, ending), "providers_in_use": predictor.providers_in_use,
                       "sessions_and_first_round_s": round(first_s, 2)}


def _run(args, work: Path) -> dict:
    import onnxruntime as ort
    import predict  # benchmarks/predict.py: the generated dataset and the untrained model folders

    from nnunetv2_meddisseg.logged_command import run_logged

    available = ort.get_available_providers()
    arms, left_out = provider_arms(args.providers, available)
    payload = {"providers_available": available, "arms": arms, "providers_left_out": left_out, "results": {},
               "export_s": {}, "cases": 0}
    for provider, why in left_out.items():
        print(f"{provider}: {why}")
    if not arms:
        print("no requested ONNX Runtime provider is available: nothing timed")
        return payload
    logs = work / "logs"
    setup = argparse.Namespace(size=args.size, num_images=args.num_images, plans="nnUNetMedDisSegPlans",
                               baseline_trainer="nnUNetTrainer", baseline_plans="nnUNetPlans",
                               trainer="nnUNetTrainerMedDisSeg", fold="0", checkpoint="checkpoint_final.pth")
    env, dataset = predict._prepare_generated(setup, work, logs)
    models = {"Med-DisSeg": (setup.trainer, setup.plans), "nnU-Net default": (setup.baseline_trainer,
                                                                             setup.baseline_plans)}
    print("[4/4] export, then both predictors in this process, alternating")
    for name, (trainer, plans) in models.items():
        payload["export_s"][name] = run_logged(
            ["nnUNetv2_meddisseg_export", "-d", dataset, "-tr", trainer, "-p", plans, "-f", "0", "-o",
             str(work / "onnx" / trainer)], env, logs / f"export_{trainer}.log")
    os.environ.update({k: env[k] for k in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results",
                                           "nnUNet_extTrainer")})
    os.environ["nnUNet_def_n_proc"] = str(args.threads)  # nnU-Net's prediction threads (read at its import)
    import torch
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.file_path_utilities import get_output_folder
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    from nnunetv2_meddisseg.torch_files import initialize_predictor

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    raw = next(Path(env["nnUNet_raw"]).glob(f"Dataset{int(dataset):03d}_*"))
    images, ending = raw / "imagesTs", ".png"
    lists = create_lists_from_splitted_dataset_folder(str(images), ending)
    cases = [Path(files[0]).name[:-len(ending) - 5] for files in lists]
    payload["cases"] = len(cases)
    results = payload["results"]
    for tta in ([True, False] if args.tta == "both" else [args.tta == "on"]):
        calls, mode = {}, f"TTA {'on' if tta else 'off'}"
        for name, (trainer, plans) in models.items():
            torch_predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=tta,
                                              device=device, verbose=False, verbose_preprocessing=False,
                                              allow_tqdm=False)
            initialize_predictor(torch_predictor, get_output_folder(dataset, trainer, plans, CONFIGURATION), ["0"],
                                 "checkpoint_final.pth")
            out_t = work / "predictions" / f"{trainer}_{mode[4:]}_nnunet"
            out_t.mkdir(parents=True, exist_ok=True)  # nnU-Net's sequential prediction writes into it first
            calls[f"{name} / nnUNetv2_predict"] = (lambda p=torch_predictor, o=out_t: p.predict_from_files_sequential(
                [list(f) for f in lists], str(o), save_probabilities=False, overwrite=True))
            torch_predictor.predict_from_files_sequential([list(f) for f in lists], str(out_t),
                                                          save_probabilities=True, overwrite=True)
            for arm, providers in arms.items():
                out_o = work / "predictions" / f"{trainer}_{mode[4:]}_{arm}"
                onnx_predictor, record = start_arm(work / "onnx" / trainer, _session_providers(
                    providers, work / "engine_cache"), tta, args.threads, images, out_o, out_t, cases, ending)
                results[f"{name} / {arm} / {mode} / agreement"] = record
                if onnx_predictor is not None:
                    calls[f"{name} / {arm}"] = lambda p=onnx_predictor, o=out_o: p.predict_folder(images, o)
        times = alternating_timings(calls, repeats=args.repeats, warmup=1, device=device)
        for key, samples in times.items():
            stats = summarize(samples)
            results[f"{key} / {mode}"] = {**stats, "images_per_s": len(cases) / stats["median_s"]}
            print(f"{key} {mode}: {len(cases) / stats['median_s']:.2f} images/s")
    return payload


def _markdown(payload: dict, args) -> str:
    run = payload["run"]
    r = run["results"]
    left_out = [f"{p} {why}" for p, why in run["providers_left_out"].items()]
    body = []
    if r:
        rows = []
        for tta in (["on", "off"] if args.tta == "both" else [args.tta]):
            for name in ("Med-DisSeg", "nnU-Net default"):
                t = r[f"{name} / nnUNetv2_predict / TTA {tta}"]
                for arm in run["arms"]:
                    a = r[f"{name} / {arm} / TTA {tta} / agreement"]
                    if "error" in a:
                        rows.append([name, tta, arm, f"{t['images_per_s']:.2f}", a["error"]] + ["-"] * 5)
                        continue
                    o = r[f"{name} / {arm} / TTA {tta}"]
                    rows.append([name, tta, arm, f"{t['images_per_s']:.2f}", f"{o['images_per_s']:.2f}",
                                 f"{o['images_per_s'] / t['images_per_s']:.2f}x",
                                 f"{a['sessions_and_first_round_s']:.1f}",
                                 f"{a['identical_masks']}/{a['cases']}", f"{a['min_dice']:.4f}",
                                 f"{a['max_probability_difference']:.1e}"])
        threads = (f"{args.threads} threads for both (torch.set_num_threads / ONNX Runtime intra-op)"
                   if args.device == "cpu" else f"nnU-Net's predictor on {args.device}")
        body += [f"{run['cases']} generated {args.size}x{args.size} RGB images, {threads}, median of {args.repeats} "
                 f"alternating rounds; onnxruntime {payload['onnxruntime']}, onnx {payload['onnx']}.", "",
                 markdown_table(["model", "TTA", "ONNX Runtime provider", "nnUNetv2_predict images/s",
                                 "ONNX Runtime images/s", "ONNX / nnU-Net", "sessions + first round s",
                                 "identical masks", "min Dice", "max prob. difference"], rows), "",
                 "Export (`nnUNetv2_meddisseg_export -f 0`, one process with its checks): "
                 + ", ".join(f"{k} {v:.0f} s" for k, v in run["export_s"].items()) + ".", ""]
        used = {f"{key.split(' / ')[1]}: {', '.join(a['providers_in_use'])}" for key, a in r.items()
                if "providers_in_use" in a}
        body += ["Providers ONNX Runtime started per arm: " + "; ".join(sorted(used)) + ".", ""]
    else:
        body += ["Nothing timed: no requested ONNX Runtime provider is available.", ""]
    if left_out:
        body += ["Left out: " + "; ".join(left_out) + ".", ""]
    forms = payload.get("export_forms")
    if forms:
        body += ["CDFA forms of `MedDisSegNet(3, 2)` exported by `torch.onnx.export(dynamo=False)` (unless "
                 "named), ONNX Runtime vs PyTorch on one 64x64 input:", "",
                 markdown_table(["form", "export s", "operators (no Constant)", "ScatterND + Col2Im",
                                 "max abs difference / max abs logit"],
                                [[f["form"], f"{f['export_s']:.1f}" if "export_s" in f else "-",
                                  f.get("operators", "-"), f.get("scatter_col2im", "-"),
                                  (f"{f['max_abs_difference']:.2g} / {f['max_abs_logit']:.3g}" if "max_abs_logit" in f
                                   else f["error"])] for f in forms])]
    return "\n".join(body)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argument_parser(__doc__, "onnx_predict")
    p.add_argument("--size", type=int, default=128, help="image height = width of the generated dataset")
    p.add_argument("--num-images", type=int, default=8, help="test images")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of both predictors")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="nnU-Net's predictor's device")
    p.add_argument("--providers", nargs="+", default=None, metavar="PROVIDER",
                   help="ONNX Runtime execution providers, each timed as its own arm (default: CPUExecutionProvider "
                        "with --device cpu, TensorrtExecutionProvider CUDAExecutionProvider with --device cuda); one "
                        "this onnxruntime lacks is left out and named in the results")
    p.add_argument("--tta", choices=("on", "off", "both"), default="both", help="mirroring")
    p.add_argument("--no-forms", action="store_true", help="leave out the export forms part")
    p.add_argument("--dynamo", action="store_true",
                   help="the export forms part also exports the graph form with dynamo=True (minutes; needs "
                        "onnxscript)")
    p.add_argument("--work", default=None, help="work folder (default: a temporary folder, removed at the end)")
    args = p.parse_args(argv)
    if args.size < 32 or args.size % 16:
        raise SystemExit(f"--size must be a multiple of 16 and at least 32, got {args.size}")
    if args.providers is None:
        args.providers = (["CPUExecutionProvider"] if args.device == "cpu"
                          else ["TensorrtExecutionProvider", "CUDAExecutionProvider"])
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA GPU here (torch.cuda.is_available() is False)")
    work = Path(args.work or tempfile.mkdtemp(prefix="meddisseg_onnx_")).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    try:
        forms = None if args.no_forms else _export_forms(args.dynamo)
        run = _run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    import torch

    torch.set_num_threads(args.threads)
    payload = {"machine": machine_info(args.device), "command": command_line(),
               "onnxruntime": package_version("onnxruntime"), "onnx": package_version("onnx"), "run": run,
               "export_forms": forms}
    return report(Path(args.out), "onnx_predict", payload, _markdown(payload, args))


if __name__ == "__main__":
    sys.exit(main())
