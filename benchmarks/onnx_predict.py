"""Images per second of nnU-Net's predictor (PyTorch) and the exported model's predictor on every arm (ONNX Runtime's
providers; OpenVINO in fp32, bf16, int8 and int8+bf16) on the same images and threads, side by side in one run, for
Med-DisSeg and default nnU-Net; with the masks' agreement, the test mDSC where the images have labels, the export's
cost, and how each CDFA form exports.

Both predictors run in this process after loading their model: nnU-Net's ``nnUNetPredictor`` as
``nnUNetv2_predict -npp 0 -nps 0`` runs it (``predict_from_files_sequential``: read, preprocess, sliding window, export
the masks), and ``nnunetv2_meddisseg.deploy.predict_onnx.OnnxPredictor.predict_folder`` (the same steps in numpy and the
arm's runtime), on a folder of N images, alternating in rounds, medians reported; with and without mirroring. The
models: ``--model MedDisSeg=FOLDER nnUNet=FOLDER``, trained nnU-Net model folders (fold 0 and its ``--checkpoint``, read
only; the images: the first N of the dataset's imagesTs in ``nnUNet_raw``, scored against its labelsTs; nnU-Net's
folders from the environment; results file ``cpu_predict``), or by default the untrained, BatchNorm-calibrated model
folders ``predict.py`` builds on N generated images (prediction time does not depend on the weights; results file
``onnx_predict``). Each is exported with ``nnUNetv2_meddisseg_export`` (with ``--int8`` for an int8 arm: calibrated on
the fold's training cases and verified on its validation cases; where it refuses, the int8 arm holds its error; the
int8 arm runs the graph's float operations in fp32, the int8+bf16 arm in bf16, where the export verified that). The
arms: ``--providers`` (ONNX Runtime; with ``--device cuda`` TensorRT and CUDA, their engines cached in the work folder,
the build in the "sessions + first round" seconds) and ``--openvino`` precisions; each arm's test mDSC, its drop from
nnU-Net's predictor's (fp32) in points and the Dice of its masks to nnU-Net's. ``--profile`` sums OpenVINO's per-layer
counters by layer type. The export forms part traces ``MedDisSegNet(3, 2)`` with its shifted and graph CDFA forms
(legacy TorchScript exporter) and compares ONNX Runtime with PyTorch on one 64x64 input.
"""
import argparse
import json
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

    from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of

    dim = {2: torch.export.Dim("height", min=32, max=4096), 3: torch.export.Dim("width", min=32, max=4096)}
    with implementation_form_of(net, "graph"), torch.no_grad():
        program = torch.onnx.export(net, (x,), input_names=["image"], output_names=["logits"], opset_version=18,
                                    dynamo=True, dynamic_shapes=(dim,))
    return program.model_proto.SerializeToString()


def _export_forms(dynamo: bool, size: int = 64) -> List[dict]:
    """The shifted and graph CDFA forms of MedDisSegNet(3, 2) traced by torch.onnx.export(dynamo=False) (and with
    ``dynamo`` the graph form by dynamo=True): seconds, operators (Constant nodes left out), ScatterND / Col2Im
    nodes and ONNX Runtime against PyTorch on one input, or the error."""
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
    for form in ("shifted", "graph") + (("graph, dynamo=True",) if dynamo else ()):
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


#: each ``--openvino`` arm: the predictor's precision and, for int8, the precision of the graph's float operations
OPENVINO_ARMS = {"fp32": ("fp32", None), "bf16": ("bf16", None), "int8": ("int8", "fp32"),
                 "int8+bf16": ("int8", "bf16")}


def openvino_arms(requested: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
    """The OpenVINO precisions to time and ``{arm: why it is left out}`` (OpenVINO missing, bf16 on a CPU without
    native bf16)."""
    from nnunetv2_meddisseg.deploy.runtimes import installed_runtimes, openvino_has_bf16

    if requested and "openvino" not in installed_runtimes():
        return [], {f"OpenVINO {p}": "openvino is not installed" for p in requested}
    bf16 = openvino_has_bf16()
    return ([p for p in requested if "bf16" not in p or bf16],
            {f"OpenVINO {p}": "this CPU has no native bf16" for p in requested if "bf16" in p and not bf16})


def start_arm(model_dir: Path, providers: Sequence[object], use_mirroring: bool, threads: int, images: Path,
              out: Path, reference: Path, cases: Sequence[str], ending: str, runtime: str = "onnxruntime",
              precision: str = "fp32", int8_floats: Optional[str] = None) -> Tuple[Optional[object], dict]:
    """One arm of one model: ``(its predictor, its record)`` after a first round, timed together with the sessions'
    creation (TensorRT builds its engines there), and the masks' agreement with nnU-Net's in ``reference``;
    ``(None, {"error": ...})`` where the arm cannot run here (ONNX Runtime can list a provider whose libraries are
    missing; the export may not have verified a precision), so that the other arms are still measured."""
    from nnunetv2_meddisseg.deploy.predict_onnx import OnnxPredictor

    start = time.perf_counter()
    try:
        predictor = OnnxPredictor(model_dir, use_mirroring=use_mirroring, threads=threads, providers=providers,
                                  runtime=runtime, precision=precision, int8_floats=int8_floats)
        predictor.predict_folder(images, out)
    except Exception as e:  # the provider's own failure is the result here
        return None, {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}
    first_s = time.perf_counter() - start
    predictor.predict_folder(images, out, save_probabilities=True)  # for the agreement, untimed
    return predictor, {**_agreement(reference, out, cases, ending), "providers_in_use": predictor.providers_in_use,
                       "sessions_and_first_round_s": round(first_s, 2)}


def _scores(out: Path, reference: Path, labels: Optional[Path], cases: Sequence[str], ending: str) -> dict:
    """Test mDSC (the mean Dice per image, where ``labels`` holds the ground truth) and the mean Dice of the masks in
    ``out`` to those in ``reference``."""
    from PIL import Image

    from nnunetv2_meddisseg.evaluation.metrics import binary_metrics

    def dice(folder: Path, other: Path) -> float:
        return float(np.mean([binary_metrics(*(np.asarray(Image.open(d / f"{c}{ending}")) for d in (folder, other)))
                              ["dice"] for c in cases]))
    scores = {"dice_to_fp32": dice(out, reference)}
    if labels is not None:
        scores["test_mdsc"] = dice(out, labels)
    return scores


def _profile(predictor, model_dir: Path, threads: int, top: int = 12) -> dict:
    """OpenVINO's per-layer counters (PERF_COUNT) of fold 0's graph in the predictor's precision, one patch-sized
    input run 3 times, summed by layer type: ``{type: ms per run}``, the largest ``top``."""
    from nnunetv2_meddisseg.deploy.precision import fold_graph
    from nnunetv2_meddisseg.deploy.runtimes import openvino_core, read_openvino_model

    d, precision = predictor.description, predictor.precision
    graph = fold_graph(model_dir, d["folds"][0], precision, "openvino", d)  # its sha256 checked
    model = read_openvino_model(graph.model, graph.weights)
    model.reshape({0: [1, d["num_input_channels"], *d["patch_size"]]})
    request = openvino_core().compile_model(model, "CPU", {"PERF_COUNT": True, "PERFORMANCE_HINT": "LATENCY",
                                                           "INFERENCE_PRECISION_HINT":
                                                               predictor.sessions[0].inference_precision,
                                                           "INFERENCE_NUM_THREADS": threads}
                                            ).create_infer_request()
    x = np.random.default_rng(0).standard_normal((1, d["num_input_channels"], *d["patch_size"]), dtype=np.float32)
    totals: Counter = Counter()
    for _ in range(3):
        request.infer({0: x})
        for info in request.profiling_info:
            totals[f"{info.node_type} ({info.exec_type})"] += info.real_time.total_seconds() * 1e3 / 3
    return {kind: round(ms, 2) for kind, ms in totals.most_common(top)}


def _models(args, work: Path, logs: Path) -> Tuple[dict, Dict[str, dict], Path, Optional[Path]]:
    """(the nnU-Net environment, ``{name: model}``, the test images, their labels or None): the trained ``--model``
    folders and their dataset's first ``--num-images`` test images, or the generated dataset and untrained models."""
    if not args.model:
        import predict  # benchmarks/predict.py: the generated dataset and the untrained model folders

        setup = argparse.Namespace(size=args.size, num_images=args.num_images, plans="nnUNetMedDisSegPlans",
                                   baseline_trainer="nnUNetTrainer", baseline_plans="nnUNetPlans",
                                   trainer="nnUNetTrainerMedDisSeg", fold="0", checkpoint=args.checkpoint)
        env, dataset = predict._prepare_generated(setup, work, logs)
        raw = next(Path(env["nnUNet_raw"]).glob(f"Dataset{int(dataset):03d}_*"))
        models = {name: {"folder": Path(env["nnUNet_results"]) / raw.name / f"{trainer}__{plans}__{CONFIGURATION}"}
                  for name, trainer, plans in (("Med-DisSeg", setup.trainer, setup.plans),
                                               ("nnU-Net default", setup.baseline_trainer, setup.baseline_plans))}
        if args.openvino and "int8" in args.openvino:  # the split nnU-Net writes when a fold is trained
            from nnunetv2.utilities.crossval_split import generate_crossval_split

            identifiers = sorted(p.name[:-len("_0000.png")] for p in (raw / "imagesTr").glob("*_0000.png"))
            splits = generate_crossval_split(identifiers, seed=12345, n_splits=5)
            (Path(env["nnUNet_preprocessed"]) / raw.name / "splits_final.json").write_text(json.dumps(splits))
        return env, models, raw / "imagesTs", None
    from nnunetv2_meddisseg.environment import EXT_TRAINER_VARIABLE, trainer_search_path

    env = {**os.environ, EXT_TRAINER_VARIABLE: trainer_search_path()}
    models = {name: {"folder": Path(folder).resolve()} for name, folder in (m.split("=", 1) for m in args.model)}
    raw = Path(env["nnUNet_raw"]) / next(iter(models.values()))["folder"].parent.name
    images = work / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    for path in sorted((raw / "imagesTs").glob("*_0000.png"))[:args.num_images]:
        shutil.copy(path, images / path.name)
    return env, models, images, raw / "labelsTs"


def _export(models: Dict[str, dict], env: dict, work: Path, logs: Path, precisions: Sequence[str],
            extra: Sequence[str], checkpoint: str) -> Dict[str, dict]:
    """Each model exported to ``work/onnx/<name>`` with ``--int8`` and ``--bf16`` where these arms are asked; where
    the export refuses them, its refusal is kept and it runs with each flag alone, then with none:
    ``{name: {"export_s", "flags": the flags it was exported with, "refused": {flags: error}}}``."""
    from nnunetv2_meddisseg.logged_command import run_logged

    records = {}
    asked = [f for f in ("--int8", "--bf16") if f[2:] in {OPENVINO_ARMS[p][0] for p in precisions}]
    attempts = [asked] + ([[f] for f in asked] if len(asked) > 1 else []) + ([[]] if asked else [])
    for name, model in models.items():
        folder, record = model["folder"], {"refused": {}}
        trainer, plans, configuration = folder.name.split("__")
        model["export"] = work / "onnx" / name.replace(" ", "_")
        command = ["nnUNetv2_meddisseg_export", "-d", folder.parent.name, "-tr", trainer, "-p", plans, "-c",
                   configuration, "-f", "0", "-chk", checkpoint, "-o", str(model["export"]), *extra]
        for flags in attempts:
            try:
                record["export_s"] = run_logged(command + flags, {
                    **env, "nnUNet_results": str(folder.parents[1])}, logs / f"export_{name.replace(' ', '_')}.log")
                record["flags"] = flags
                break
            except Exception as e:  # the export's refusal (a bound missed) is the arm's result
                if not flags:
                    raise
                text = " ".join(str(e).split())
                record["refused"][" ".join(flags)] = f"{type(e).__name__}: {text[max(text.find('exit code'), 0):]}"
        records[name] = record
    return records


def _run(args, work: Path) -> dict:
    import onnxruntime as ort

    available = ort.get_available_providers()
    arms, left_out = provider_arms(args.providers, available)
    precisions, ov_left_out = openvino_arms(args.openvino or [])
    payload = {"providers_available": available, "arms": arms, "openvino_precisions": precisions,
               "providers_left_out": {**left_out, **ov_left_out}, "results": {}, "export": {}, "cases": 0}
    for provider, why in payload["providers_left_out"].items():
        print(f"{provider}: {why}")
    if not arms and not precisions:
        print("no requested arm is available: nothing timed")
        return payload
    logs = work / "logs"
    env, models, images, labels = _models(args, work, logs)
    print("[4/4] export, then both predictors in this process, alternating")
    payload["export"] = _export(models, env, work, logs, precisions, (args.export_args or "").split(),
                                args.checkpoint)
    for key in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results", "nnUNet_extTrainer"):
        if key in env:
            os.environ[key] = env[key]
    os.environ["nnUNet_def_n_proc"] = str(args.threads)  # nnU-Net's prediction threads (read at its import)
    import torch
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    from nnunetv2_meddisseg.torch_files import initialize_predictor

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ending = ".png"
    lists = create_lists_from_splitted_dataset_folder(str(images), ending)
    cases = [Path(files[0]).name[:-len(ending) - 5] for files in lists]
    payload["cases"] = len(cases)
    results = payload["results"]
    runs = [(arm, {"providers": _session_providers(providers, work / "engine_cache")}) for arm, providers in
            arms.items()] + [(f"OpenVINO {p}", dict(zip(("runtime", "precision", "int8_floats"),
                                                        ("openvino", *OPENVINO_ARMS[p])))) for p in precisions]
    for tta in ([True, False] if args.tta == "both" else [args.tta == "on"]):
        calls, mode, outputs = {}, f"TTA {'on' if tta else 'off'}", {}
        for name, model in models.items():
            torch_predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=tta,
                                              device=device, verbose=False, verbose_preprocessing=False,
                                              allow_tqdm=False)
            initialize_predictor(torch_predictor, model["folder"], ["0"], args.checkpoint)  # weights-only
            out_t = work / "predictions" / f"{name}_{mode[4:]}_nnunet".replace(" ", "_")
            out_t.mkdir(parents=True, exist_ok=True)  # nnU-Net's sequential prediction writes into it first
            calls[f"{name} / nnUNetv2_predict"] = (lambda p=torch_predictor, o=out_t: p.predict_from_files_sequential(
                [list(f) for f in lists], str(o), save_probabilities=False, overwrite=True))
            torch_predictor.predict_from_files_sequential([list(f) for f in lists], str(out_t),
                                                          save_probabilities=True, overwrite=True)
            outputs[f"{name} / nnUNetv2_predict"] = (out_t, out_t)
            for arm, kwargs in runs:
                precision = kwargs.get("precision", "fp32")
                if precision != "fp32" and f"--{precision}" not in payload["export"][name]["flags"]:
                    continue  # the export's guard refused this precision: reported with the export
                out_o = work / "predictions" / f"{name}_{mode[4:]}_{arm}".replace(" ", "_")
                onnx_predictor, record = start_arm(model["export"], kwargs.get("providers", ()), tta, args.threads,
                                                   images, out_o, out_t, cases, ending, kwargs.get("runtime",
                                                                                                   "onnxruntime"),
                                                   kwargs.get("precision", "fp32"), kwargs.get("int8_floats"))
                results[f"{name} / {arm} / {mode} / agreement"] = record
                if onnx_predictor is not None:
                    calls[f"{name} / {arm}"] = lambda p=onnx_predictor, o=out_o: p.predict_folder(images, o)
                    outputs[f"{name} / {arm}"] = (out_o, out_t)
                    if args.profile and arm.startswith("OpenVINO"):
                        record["profile_ms_by_layer_type"] = _profile(onnx_predictor, model["export"],
                                                                      args.threads)
        times = alternating_timings(calls, repeats=args.repeats, warmup=0, device=device)
        for key, samples in times.items():
            stats = summarize(samples)
            results[f"{key} / {mode}"] = {**stats, "images_per_s": len(cases) / stats["median_s"],
                                          **_scores(*outputs[key], labels, cases, ending)}
            print(f"{key} {mode}: {len(cases) / stats['median_s']:.2f} images/s")
    return payload


#: the network names of the arms list
NETWORKS = {"Med-DisSeg": "MedDisSeg", "nnU-Net default": "nnUNet"}


def arms_list(run: dict) -> List[dict]:
    """Every timed arm of ``run`` (nnU-Net's predictor too) as one record: network, runtime, precision, tta,
    images/s, speed-up over nnU-Net's predictor, test mDSC and its drop from nnU-Net's predictor's in points, the
    mean Dice of its masks to nnU-Net's."""
    rows = []
    for key, figures in run["results"].items():
        name, arm, mode = (key.split(" / ") + [""])[:3]
        if key.endswith(" / agreement") or not mode:
            continue
        torch_figures = run["results"][f"{name} / nnUNetv2_predict / {mode}"]
        runtime, precision = (("pytorch", "fp32") if arm == "nnUNetv2_predict" else
                              ("openvino", arm.split()[1]) if arm.startswith("OpenVINO") else (f"onnxruntime {arm}",
                                                                                                "fp32"))
        row = {"network": NETWORKS.get(name, name), "runtime": runtime, "precision": precision,
               "tta": mode == "TTA on", "images_per_s": round(figures["images_per_s"], 3),
               "speedup_vs_nnunet_predictor": round(figures["images_per_s"] / torch_figures["images_per_s"], 3),
               "dice_to_fp32": round(figures["dice_to_fp32"], 5)}
        if "test_mdsc" in figures:
            row.update(test_mdsc=round(figures["test_mdsc"], 5),
                       mdsc_drop_points=round(100 * (torch_figures["test_mdsc"] - figures["test_mdsc"]), 3))
        rows.append(row)
    return rows


def targets(arms: List[dict]) -> Dict[str, dict]:
    """Per network with test labels: the fastest arm (TTA on) whose test mDSC drops by at most 0.5 points, its
    speed-up over nnU-Net's predictor and the target (Med-DisSeg 3x, nnU-Net's network 4x)."""
    found = {}
    for network, target in (("MedDisSeg", 3.0), ("nnUNet", 4.0)):
        fit = [a for a in arms if a["network"] == network and a["tta"] and a["runtime"] != "pytorch"
               and a.get("mdsc_drop_points", 1e9) <= 0.5]
        if any(a["network"] == network and "test_mdsc" in a for a in arms):
            best = max(fit, key=lambda a: a["speedup_vs_nnunet_predictor"], default=None)
            found[network] = {"target_speedup": target, "arm": best and f"{best['runtime']} {best['precision']}",
                              "speedup": best and best["speedup_vs_nnunet_predictor"],
                              "met": bool(best) and best["speedup_vs_nnunet_predictor"] >= target}
    return found


def _markdown(payload: dict, args) -> str:
    run = payload["run"]
    left_out = [f"{p} {why}" for p, why in run["providers_left_out"].items()]
    body = []
    if payload["arms"]:
        threads = (f"{args.threads} threads for all (torch.set_num_threads, ONNX Runtime intra-op, OpenVINO)"
                   if args.device == "cpu" else f"nnU-Net's predictor on {args.device}")
        images = "test images" if args.model else f"generated {args.size}x{args.size} RGB images"
        body += [f"{run['cases']} {images}, {threads}, median of {args.repeats} alternating rounds; onnxruntime "
                 f"{payload['onnxruntime']}, openvino {payload['openvino']}, nncf {payload['nncf']}.", "",
                 markdown_table(["network", "TTA", "runtime", "precision", "images/s", "vs nnU-Net's predictor",
                                 "test mDSC", "drop (points)", "Dice to fp32"],
                                [[a["network"], "on" if a["tta"] else "off", a["runtime"], a["precision"],
                                  f"{a['images_per_s']:.2f}", f"{a['speedup_vs_nnunet_predictor']:.2f}x",
                                  f"{a['test_mdsc']:.4f}" if "test_mdsc" in a else "-",
                                  f"{a['mdsc_drop_points']:.2f}" if "mdsc_drop_points" in a else "-",
                                  f"{a['dice_to_fp32']:.4f}"] for a in payload["arms"]]), ""]
        body += [f"Target {k}: {t['arm']} at {t['speedup']}x (target {t['target_speedup']}x): "
                 f"{'met' if t['met'] else 'MISSED'}." for k, t in payload["targets"].items()]
        body += ["", "Export (`nnUNetv2_meddisseg_export -f 0`, with `--int8` / `--bf16` for those arms, one process "
                 "with its checks and guard): " + ", ".join(f"{k} {v['export_s']:.0f} s" for k, v in
                                                          run["export"].items()) + "."]
        body += [f"{key}: {record['error']}" for key, record in run["results"].items() if "error" in record]
        body += [f"{k}: export {flag} refused ({error})" for k, v in run["export"].items()
                 for flag, error in v["refused"].items()]
        for key, record in run["results"].items():
            if "profile_ms_by_layer_type" in record:
                body += ["", f"{key[:-len(' / agreement')]}, OpenVINO counters (ms per patch by layer type): "
                         + ", ".join(f"{k} {v}" for k, v in record["profile_ms_by_layer_type"].items())]
        used = {f"{key.split(' / ')[1]}: {', '.join(a['providers_in_use'])}" for key, a in run["results"].items()
                if a.get("providers_in_use")}
        body += ["", "Providers ONNX Runtime started per arm: " + "; ".join(sorted(used)) + ".", ""]
    else:
        body += ["Nothing timed: no requested arm is available.", ""]
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
    p = argument_parser(__doc__, "onnx_predict (cpu_predict with --model)")
    p.add_argument("--model", nargs="+", default=None, metavar="NAME=FOLDER",
                   help="trained nnU-Net model folders (.../nnUNet_results/DatasetX/Trainer__Plans__2d, fold 0) named "
                        "MedDisSeg and nnUNet; nnUNet_raw and nnUNet_preprocessed from the environment")
    p.add_argument("--checkpoint", default="checkpoint_final.pth",
                   help="checkpoint file name in fold_0 of each --model folder (nnU-Net's -chk), e.g. "
                        "checkpoint_best.pth")
    p.add_argument("--size", type=int, default=128, help="image height = width of the generated dataset")
    p.add_argument("--num-images", type=int, default=None,
                   help="test images (default: 8 generated, or every test image of the --model dataset)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of all predictors")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="nnU-Net's predictor's device")
    p.add_argument("--providers", nargs="*", default=None, metavar="PROVIDER",
                   help="ONNX Runtime execution providers, each timed as its own arm (default: CPUExecutionProvider "
                        "with --device cpu, TensorrtExecutionProvider CUDAExecutionProvider with --device cuda); one "
                        "this onnxruntime lacks is left out and named in the results")
    p.add_argument("--openvino", nargs="+", default=None, choices=tuple(OPENVINO_ARMS),
                   help="OpenVINO arms (int8: exported with --int8, its float operations in fp32; int8+bf16: in bf16, "
                        "where the export verified that; bf16: where the export verified it)")
    p.add_argument("--export-args", default=None,
                   help="further options of nnUNetv2_meddisseg_export, e.g. \"--calibration_tiles 128\"")
    p.add_argument("--profile", action="store_true", help="OpenVINO's per-layer counters of each OpenVINO arm")
    p.add_argument("--tta", choices=("on", "off", "both"), default="both", help="mirroring")
    p.add_argument("--no-forms", action="store_true", help="leave out the export forms part")
    p.add_argument("--dynamo", action="store_true",
                   help="the export forms part also exports the graph form with dynamo=True (minutes; needs "
                        "onnxscript)")
    p.add_argument("--work", default=None, help="work folder (default: a temporary folder, removed at the end)")
    args = p.parse_args(argv)
    if args.model and any(m.split("=")[0] not in NETWORKS.values() or "=" not in m for m in args.model):
        raise SystemExit(f"--model: expected MedDisSeg=FOLDER and/or nnUNet=FOLDER, got {' '.join(args.model)}")
    if args.size < 32 or args.size % 16:
        raise SystemExit(f"--size must be a multiple of 16 and at least 32, got {args.size}")
    args.num_images = args.num_images or (None if args.model else 8)
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
    arms = arms_list(run)
    payload = {"machine": machine_info(args.device), "command": command_line(), "arms": arms,
               "targets": targets(arms), **{k: package_version(k) for k in ("onnxruntime", "onnx", "openvino", "nncf")},
               "run": run, "export_forms": forms}
    missed = "; ".join(f"{k} {t['speedup']}x < {t['target_speedup']}x" for k, t in payload["targets"].items()
                       if not t["met"])
    return report(Path(args.out), "cpu_predict" if args.model else "onnx_predict", payload,
                  _markdown(payload, args), missed or None)


if __name__ == "__main__":
    sys.exit(main())
