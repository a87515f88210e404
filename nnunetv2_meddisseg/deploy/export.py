"""``nnUNetv2_meddisseg_export``: a trained nnU-Net 2D model (any trainer) as ONNX graphs checked against PyTorch.

Loaded as ``nnUNetv2_predict`` loads it (deep supervision off), each fold is traced, the CDFA blocks in their graph form
(no in-place writes, which a tracer loses), to ``fold_<f>/model.onnx`` with symbolic batch, height and width. ONNX
Runtime must match PyTorch within ``--tolerance`` times the largest |logit| on random inputs and up to two preprocessed
cases. ``--int8`` / ``--bf16`` (need ``nnUNet_preprocessed``) add each fold in reduced precision where it passes the
accuracy guard. Any failure writes nothing; ``-o`` is checked first, written whole, replaces only an earlier export.

Only what the ONNX predictor runs is exported: 2D configurations of 2D natural images (.png, .bmp, .tif) with the plans'
spacing (1, 1) (no resampling), no cascade.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of
from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.deploy.description import (
    DESCRIPTION_FILE,
    FORMAT_VERSION,
    INPUT_NAME,
    NATURAL_IMAGE_ENDINGS,
    OUTPUT_NAME,
    WRITTEN_BY,
    GraphFields,
    bind_graph,
    fold_model_file,
    sha256_of,
    validate_description,
)
from nnunetv2_meddisseg.deploy.export_folder import DEFAULT_NAME, check_output, write_export
from nnunetv2_meddisseg.deploy.precision_guard import (
    DEFAULT_CALIBRATION_TILES,
    Bounds,
    case_identifiers,
    guard_folds,
    read_case,
)
from nnunetv2_meddisseg.deploy.sliding_window import pad_to_patch
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.module_wrappers import unwrap_module

__all__ = ["EXPORT_FORM", "DEFAULT_TOLERANCE", "export_model", "trace_to_onnx", "declare_channels",
           "compare_with_onnxruntime", "main"]

PROG = "nnUNetv2_meddisseg_export"
#: the CDFA form the exporter traces (``blocks.device_forms``)
EXPORT_FORM = "graph"
#: largest |ONNX Runtime - PyTorch| allowed, as a fraction of the largest |logit| PyTorch gives
DEFAULT_TOLERANCE = 1e-3
OPSET = 18
#: how many preprocessed training cases the check runs where the dataset is there
REAL_CASES = 2


def _onnx_modules():
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise UserError(f"{e.name} is not installed: pip install 'nnunetv2_meddisseg[onnx]'") from e
    return onnx, onnxruntime


def trace_to_onnx(network: torch.nn.Module, example: torch.Tensor, form: Optional[str] = None) -> bytes:
    """``network`` (eval, CPU) traced on ``example`` with the CDFA blocks in ``form`` (None: ``EXPORT_FORM``; restored
    after) -> ONNX bytes, ``image`` (B, C, H, W) -> ``logits`` (B, K, H, W) with B, H, W symbolic."""
    form = EXPORT_FORM if form is None else form  # read at the call: a test replaces the module's value
    axes = {0: "batch", 2: "height", 3: "width"}
    buffer = io.BytesIO()
    with implementation_form_of(network, form), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python values it records as constants
        torch.onnx.export(network, (example,), buffer, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          opset_version=OPSET, dynamo=False, dynamic_axes={INPUT_NAME: axes, OUTPUT_NAME: axes})
    return buffer.getvalue()


def declare_channels(model: bytes, channels: int, heads: int) -> bytes:
    """``model`` with the input's channel axis set to ``channels`` and the output's to ``heads`` where the tracer left
    them symbolic (e.g. behind Med-DisSeg's final Add), so the predictor can check them against the description."""
    onnx, _ = _onnx_modules()
    proto = onnx.load_from_string(model)
    for value, size in ((proto.graph.input[0], channels), (proto.graph.output[0], heads)):
        dim = value.type.tensor_type.shape.dim[1]
        if not dim.HasField("dim_value"):
            dim.dim_value = size  # replaces the symbolic name (one of the two fields)
    return proto.SerializeToString()


def compare_with_onnxruntime(network: torch.nn.Module, model: bytes, inputs: Dict[str, np.ndarray]
                             ) -> List[dict]:
    """``model`` in ONNX Runtime (CPU) against ``network`` in PyTorch: a record per named input (B, C, H, W) float32."""
    _, ort = _onnx_modules()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    results = []
    for name, x in inputs.items():
        with torch.no_grad():
            expected = network(torch.from_numpy(x)).float().numpy()
        got = session.run(None, {INPUT_NAME: x})[0]
        if got.shape != expected.shape:
            raise UserError(f"{name}: ONNX Runtime's logits have shape {got.shape}, PyTorch's {expected.shape}")
        scale = float(np.abs(expected).max())
        difference = float(np.abs(got - expected).max()) if np.isfinite(got).all() else float("inf")
        results.append({"input": name, "shape": list(x.shape), "max_abs_logit": scale,
                        "max_abs_difference": difference, "relative_difference": difference / max(scale, 1e-12)})
    return results


def _patch_of(case: np.ndarray, patch_size: Sequence[int]) -> np.ndarray:
    """(C, 1, X, Y) -> the centre (1, C, *patch_size), zero-padded where the case is smaller."""
    image, _ = pad_to_patch(case[:, 0], patch_size)
    x, y = [(size - patch) // 2 for size, patch in zip(image.shape[1:], patch_size)]
    return np.ascontiguousarray(image[None, :, x:x + patch_size[0], y:y + patch_size[1]])


def _check_inputs(predictor, preprocessed: Optional[Path]) -> Dict[str, np.ndarray]:
    """Random patches (batch 2), a random input twice the patch size and centre patches of up to REAL_CASES cases."""
    patch = list(predictor.configuration_manager.patch_size)
    channels = len(predictor.configuration_manager.normalization_schemes)
    rng = np.random.default_rng(0)
    inputs = {"random patches": rng.standard_normal((2, channels, *patch), dtype=np.float32),
              "random input of twice the patch size": rng.standard_normal((1, channels, *[2 * p for p in patch]),
                                                                          dtype=np.float32)}
    if preprocessed is not None and preprocessed.is_dir():
        for identifier in case_identifiers(preprocessed)[:REAL_CASES]:
            data = read_case(preprocessed, identifier, channels)[0].astype(np.float32)
            inputs[f"case {identifier}"] = _patch_of(data, patch)
    return inputs


def _preprocessed_folder(predictor) -> Optional[Path]:
    """The configuration's folder in ``nnUNet_preprocessed``; None if unset (nnU-Net's path raises when read unset)."""
    from nnunetv2.paths import nnUNet_preprocessed

    if not nnUNet_preprocessed.is_set():
        return None
    return (Path(nnUNet_preprocessed.get()) / predictor.plans_manager.plans["dataset_name"]
            / predictor.configuration_manager.data_identifier)


def _refuse_unsupported(predictor, configuration: str) -> None:
    cm, plans = predictor.configuration_manager, predictor.plans_manager.plans
    ending = predictor.dataset_json.get("file_ending", "")
    if len(cm.patch_size) != 2:
        raise UserError(f"configuration {configuration!r} is {len(cm.patch_size)}D: the ONNX export and predictor "
                        f"handle 2D configurations only")
    if cm.previous_stage_name is not None:
        raise UserError("cascaded configurations (previous_stage) are not supported by the ONNX predictor")
    if ending not in NATURAL_IMAGE_ENDINGS:
        raise UserError(f"the dataset's images are {ending!r} files: the ONNX predictor reads 2D natural images "
                        f"({', '.join(NATURAL_IMAGE_ENDINGS)}) only")
    if any(abs(s - 1.0) > 1e-8 for s in cm.spacing):
        raise UserError(f"the plans' 2D spacing is {cm.spacing}, not (1, 1): prediction would resample the images, "
                        f"which the ONNX predictor does not do")
    if plans.get("image_reader_writer", "NaturalImage2DIO") != "NaturalImage2DIO":
        raise UserError(f"the plans read images with {plans['image_reader_writer']}: the ONNX predictor reads them as "
                        f"nnU-Net's NaturalImage2DIO does only")


def _description(predictor, args, folds: List[dict]) -> dict:
    pm, cm, lm = predictor.plans_manager, predictor.configuration_manager, predictor.label_manager
    intensity = pm.foreground_intensity_properties_per_channel
    normalization = [{"scheme": scheme, "use_mask_for_norm": bool(cm.use_mask_for_norm[c]),
                      "intensity_properties": intensity.get(str(c), {})}
                     for c, scheme in enumerate(cm.normalization_schemes)]
    mirror = predictor.allowed_mirroring_axes
    return {
        "format_version": FORMAT_VERSION,
        "written_by": WRITTEN_BY,
        "trainer": predictor.trainer_name,
        "plans": args.p,
        "configuration": args.c,
        "checkpoint": args.chk,
        "dataset": predictor.dataset_json.get("name"),
        "folds": folds,
        "patch_size": [int(p) for p in cm.patch_size],
        "num_input_channels": len(normalization),
        "num_segmentation_heads": int(lm.num_segmentation_heads),
        "normalization": normalization,
        "transpose_forward": [int(a) for a in pm.transpose_forward],
        "transpose_backward": [int(a) for a in pm.transpose_backward],
        "spacing": [float(s) for s in cm.spacing],
        "file_ending": predictor.dataset_json["file_ending"],
        "labels": predictor.dataset_json["labels"],
        "regions_class_order": list(lm.regions_class_order) if lm.has_regions else None,
        "mirror_axes": [int(a) for a in mirror] if mirror is not None else None,
        "tile_step_size": 0.5,
        "opset": OPSET,
        "graph": "input image (B, C, H, W) float32 -> logits (B, K, H, W); B, H, W symbolic",
    }


def _model_folder(args) -> Path:
    from nnunetv2.utilities.file_path_utilities import get_output_folder

    try:
        folder = Path(get_output_folder(args.d, args.tr, args.p, args.c))
    except (RuntimeError, ValueError) as e:
        raise UserError(f"-d {args.d}: {' '.join(str(e).split())[:300]}") from e
    if not folder.is_dir():
        raise UserError(f"{folder}: no trained model (-d {args.d} -c {args.c} -tr {args.tr} -p {args.p})")
    for fold in args.f:
        checkpoint = folder / f"fold_{fold}" / args.chk
        if not checkpoint.is_file():
            raise UserError(f"{checkpoint}: not found (fold {fold}, -chk {args.chk})")
    return folder


def _json_object(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: not found (nnU-Net writes it into the model folder when it trains)")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (truncated? {e.msg} at line {e.lineno})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: expected a JSON object, as nnU-Net writes it")
    return value


def export_model(args) -> Tuple[Path, dict]:
    """Export and check every fold of ``args``; write nothing unless all pass. Returns (output folder, description)."""
    _onnx_modules()
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.paths import nnUNet_preprocessed

    from nnunetv2_meddisseg.torch_files import initialize_predictor

    reduced = [p for p, asked in (("int8", args.int8), ("bf16", args.bf16)) if asked]
    if reduced and not nnUNet_preprocessed.is_set():
        raise UserError(f"--{reduced[0]} needs nnUNet_preprocessed, which is not set: a reduced precision is "
                        f"calibrated and verified on the fold's preprocessed training and validation cases "
                        f"(splits_final.json); set it to the folder nnUNetv2_preprocess wrote, or export fp32 alone")
    folder = _model_folder(args)
    output = check_output(Path(args.o) if args.o is not None else folder / DEFAULT_NAME, folder)
    for name in ("plans.json", "dataset.json"):  # nnU-Net's predictor reads them before the checkpoints
        _json_object(folder / name)
    predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=True,
                                device=torch.device("cpu"), verbose=False, allow_tqdm=False)
    with warnings.catch_warnings():
        # deprecation notices of the modules nnU-Net's trainer search imports (timm's, for example)
        warnings.simplefilter("ignore", FutureWarning)
        initialize_predictor(predictor, folder, args.f, args.chk)  # checkpoints read weights-only
    _refuse_unsupported(predictor, args.c)
    preprocessed = _preprocessed_folder(predictor)
    network = unwrap_module(predictor.network).cpu().eval()  # uncompiled
    if hasattr(network, "cpu_bf16"):
        network.cpu_bf16 = False  # the graphs hold the fp32 forward, whatever nnUNet_meddisseg_cpu_bf16 says
    inputs = _check_inputs(predictor, preprocessed)
    if not any(name.startswith("case ") for name in inputs):
        where = "nnUNet_preprocessed is not set" if preprocessed is None else f"none in {preprocessed}"
        print(f"no preprocessed cases ({where}): ONNX Runtime is checked against PyTorch on random inputs only")
    example = torch.from_numpy(inputs["random patches"][:1])
    models, folds = {}, []
    # the fields the graphs hold, checked before the tracing: the folds filled in below are the export's own
    description = validate_description(_description(predictor, args, folds), output / DESCRIPTION_FILE, GraphFields)
    for fold, parameters in zip(args.f, predictor.list_of_parameters):
        network.load_state_dict(parameters)
        model = bind_graph(declare_channels(trace_to_onnx(network, example), example.shape[1],
                                            predictor.label_manager.num_segmentation_heads), description)
        checks = compare_with_onnxruntime(network, model, inputs)
        worst = max(checks, key=lambda c: c["relative_difference"])
        if not worst["relative_difference"] <= args.tolerance:
            raise UserError(
                f"fold {fold}: ONNX Runtime's logits differ from PyTorch's by {worst['max_abs_difference']:.3g} on "
                f"the {worst['input']} (largest |logit| {worst['max_abs_logit']:.3g}; relative "
                f"{worst['relative_difference']:.2e} > tolerance {args.tolerance:g}): the export is wrong, "
                f"nothing written")
        models[str(fold)] = model
        folds.append({"fold": str(fold), "file": fold_model_file(fold), "sha256": sha256_of(model),
                      "checks": checks})
        print(f"fold {fold}: exported, ONNX Runtime vs PyTorch: largest relative difference "
              f"{worst['relative_difference']:.1e} ({len(checks)} inputs)")
    extra = guard_folds(description, models, preprocessed, reduced, Bounds(args.min_dice_to_fp32,
                        args.max_pseudo_dice_drop), args.calibration_tiles) if reduced else {}
    write_export(output, models, description, extra)
    return output, description


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter,
                                description="Export a trained nnU-Net 2D model (Med-DisSeg or any trainer) to ONNX, "
                                            "checked against PyTorch before it is written, for "
                                            "nnUNetv2_meddisseg_predict_onnx.")
    p.add_argument("-d", required=True, help="dataset name or id, as for nnUNetv2_predict")
    p.add_argument("-c", default="2d", help="configuration (2D only)")
    p.add_argument("-f", nargs="+", default=["0", "1", "2", "3", "4"], help="folds to export")
    p.add_argument("-tr", default="nnUNetTrainer", help="trainer class")
    p.add_argument("-p", default="nnUNetPlans", help="plans identifier")
    p.add_argument("-chk", default="checkpoint_final.pth", help="checkpoint file name in each fold folder")
    p.add_argument("-o", default=None,
                   help="output folder (default: onnx inside the model folder): a new or empty folder, or an earlier "
                        "export, which is replaced whole once every fold passes")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="largest difference ONNX Runtime vs PyTorch allowed, as a fraction of the largest |logit|")
    guard = p.add_argument_group("reduced precision (OpenVINO; verified on each fold's validation cases against fp32)")
    guard.add_argument("--int8", action="store_true",
                       help="also write each fold as an INT8 OpenVINO model (NNCF, calibrated on the fold's training "
                            "cases) within the bounds below, blocks kept in fp32 where needed, or write nothing")
    guard.add_argument("--bf16", action="store_true",
                       help="verify bf16 within the bounds below (blocks kept in fp32 where needed), or write nothing")
    guard.add_argument("--min_dice_to_fp32", type=float, default=Bounds.min_dice_to_fp32,
                       help="least mean Dice of the reduced-precision masks to the fp32 masks")
    guard.add_argument("--max_pseudo_dice_drop", type=float, default=Bounds.max_pseudo_dice_drop,
                       help="largest drop of the pseudo Dice to the ground truth from fp32's, in points (negative: "
                            "it must gain)")
    guard.add_argument("--calibration_tiles", type=int, default=DEFAULT_CALIBRATION_TILES,
                       help="INT8 calibration tiles, one from each of as many of the fold's training cases")
    return p


def _command(argv: Optional[Sequence[str]]) -> int:
    args = _parser().parse_args(argv)
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise UserError(f"--tolerance must be positive and finite, got {args.tolerance}")
    if not 0 < args.min_dice_to_fp32 <= 1:  # also refuses nan
        raise UserError(f"--min_dice_to_fp32 must be in (0, 1], got {args.min_dice_to_fp32}")
    if not math.isfinite(args.max_pseudo_dice_drop):
        raise UserError(f"--max_pseudo_dice_drop must be a finite number of points, got {args.max_pseudo_dice_drop}")
    if args.calibration_tiles < 1:
        raise UserError(f"--calibration_tiles must be at least 1, got {args.calibration_tiles}")
    if len(set(args.f)) != len(args.f):
        raise UserError(f"-f {' '.join(args.f)}: a fold named twice")
    output, description = export_model(args)
    print(f"{output}: {len(description['folds'])} fold(s) and {DESCRIPTION_FILE} written")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
