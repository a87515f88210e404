"""``nnUNetv2_meddisseg_predict_onnx``: predict 2D images with a model exported by ``nnUNetv2_meddisseg_export``,
on OpenVINO or ONNX Runtime with numpy (PyTorch and nnU-Net are not imported).

Input and output are as ``nnUNetv2_predict``'s: a folder of ``<case>_<XXXX><ending>`` files (one per channel)
-> ``<case><ending>`` label images. The pipeline is nnU-Net's (``deploy.image_pipeline``,
``deploy.sliding_window``); the folds of the export folder are ensembled.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, UserError, run_command
from nnunetv2_meddisseg.deploy.description import read_description
from nnunetv2_meddisseg.deploy.image_pipeline import (
    preprocess,
    probabilities_from_logits,
    read_case,
    restore_probabilities,
    restore_shape,
    segmentation_from_logits,
    write_segmentation,
)
from nnunetv2_meddisseg.deploy.precision import PRECISIONS, fold_session
from nnunetv2_meddisseg.deploy.runtimes import RUNTIMES, default_runtime
from nnunetv2_meddisseg.deploy.sliding_window import sliding_window_logits
from nnunetv2_meddisseg.files import write_atomically

__all__ = ["OnnxPredictor", "find_cases", "main"]

PROG = "nnUNetv2_meddisseg_predict_onnx"


def _save_probabilities(probabilities: np.ndarray, path: Path) -> None:
    """``probabilities`` into the npz file ``path`` as nnU-Net's ``--save_probabilities`` names them (written
    through a file object: ``np.savez_compressed`` would append ``.npz`` to another file name)."""
    with open(path, "wb") as f:
        np.savez_compressed(f, probabilities=probabilities)


def find_cases(folder: Path, file_ending: str) -> Dict[str, List[Path]]:
    """``{case: [its files in channel order]}`` of an nnU-Net input folder (``<case>_<XXXX><ending>``; an RGB
    file holds three channels)."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (expected images named <case>_0000{file_ending})")
    pattern = re.compile(rf"^(.+)_(\d{{4}}){re.escape(file_ending)}$")
    cases: Dict[str, List[Path]] = {}
    for path in sorted(folder.iterdir()):
        match = pattern.match(path.name)
        if match:
            cases.setdefault(match.group(1), []).append(path)
    if not cases:
        raise UserError(f"{folder}: no images named <case>_0000{file_ending}")
    return cases


class OnnxPredictor:
    """The exported folds of one model as sessions of a runtime (``deploy.runtimes``), and nnU-Net's 2D pipeline
    around them.

    model_dir: an export folder; folds: a subset of its folds (None: all); runtime: ``openvino`` or ``onnxruntime``
    (None: the first installed of :data:`~nnunetv2_meddisseg.deploy.runtimes.RUNTIMES`); precision: ``fp32``, or
    ``bf16`` / ``int8`` where the export verified them (``deploy.precision``); providers: ONNX Runtime execution
    providers in order of preference, each a name or ``(name, provider options)``; threads: the runtime's CPU
    threads (None: its default)."""

    def __init__(self, model_dir: Path, folds: Optional[Sequence[str]] = None, use_mirroring: bool = True,
                 step_size: Optional[float] = None,
                 providers: Sequence[Union[str, Tuple[str, dict]]] = ("CPUExecutionProvider",),
                 threads: Optional[int] = None, runtime: Optional[str] = None, precision: str = "fp32") -> None:
        self.description = description = read_description(Path(model_dir))
        exported = {str(f["fold"]): f for f in description["folds"]}
        chosen = list(exported) if folds is None else [str(f) for f in folds]
        unknown = [f for f in chosen if f not in exported]
        if unknown:
            raise UserError(f"{model_dir}: fold(s) {', '.join(unknown)} not exported (there: {', '.join(exported)})")
        self.runtime = default_runtime() if runtime is None else runtime
        self.precision = precision
        self.sessions = [fold_session(Path(model_dir), exported[f], self.runtime, precision, providers, threads)
                         for f in chosen]
        self.folds = chosen
        #: the providers ONNX Runtime started (it falls back to the next one, with a warning, where one cannot start)
        self.providers_in_use = getattr(self.sessions[0], "providers_in_use", [])
        self.mirror_axes = description["mirror_axes"] if use_mirroring else None
        self.step_size = description["tile_step_size"] if step_size is None else step_size
        if not 0 < self.step_size <= 1:
            raise UserError(f"--step_size must be in (0, 1], got {self.step_size}")
        self.num_foreground = len([v for v in description["labels"].values() if isinstance(v, int) and v > 0])

    def logits(self, data):
        """A preprocessed case (C, 1, X, Y) -> the folds' mean logits (K, 1, X, Y)."""
        d = self.description
        return sliding_window_logits(data, self.sessions, d["patch_size"], self.step_size, self.mirror_axes,
                                     d["num_segmentation_heads"])

    def predict_files(self, files: Sequence[Path], with_probabilities: bool = False):
        """One case's channel files -> its segmentation (1, X, Y) in the read image's shape; with
        ``with_probabilities`` also the class probabilities (K, 1, X, Y) float32 as nnU-Net saves them."""
        d = self.description
        data, geometry = preprocess(read_case(files), d, str(files[0]))
        logits = self.logits(data)
        segmentation = restore_shape(segmentation_from_logits(logits, d["regions_class_order"]), geometry, d,
                                     self.num_foreground)
        if not with_probabilities:
            return segmentation
        probabilities = probabilities_from_logits(logits, d["regions_class_order"])
        return segmentation, restore_probabilities(probabilities, geometry, d)

    def predict_folder(self, input_folder: Path, output_folder: Path, verbose: bool = False,
                       save_probabilities: bool = False) -> List[Path]:
        """Every case of ``input_folder`` -> ``output_folder/<case><ending>`` (and ``<case>.npz`` with the
        probabilities where ``save_probabilities``); returns the written label files."""
        ending = self.description["file_ending"]
        cases = find_cases(Path(input_folder), ending)
        output_folder = Path(output_folder)
        if output_folder.exists() and not output_folder.is_dir():
            raise UserError(f"{output_folder}: exists and is not a folder")
        output_folder.mkdir(parents=True, exist_ok=True)
        written = []
        for case, files in cases.items():
            start = time.perf_counter()
            target = output_folder / f"{case}{ending}"
            if save_probabilities:
                segmentation, probabilities = self.predict_files(files, with_probabilities=True)
                write_atomically(output_folder / f"{case}.npz", partial(_save_probabilities, probabilities))
            else:
                segmentation = self.predict_files(files)
            write_segmentation(segmentation, target)
            written.append(target)
            if verbose:
                print(f"{case}: {time.perf_counter() - start:.2f} s")
        return written


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter,
                                description="Predict 2D images with an exported model (nnUNetv2_meddisseg_export) "
                                            "on OpenVINO or ONNX Runtime, as nnUNetv2_predict does, without "
                                            "PyTorch.")
    p.add_argument("-i", dest="input", type=Path, required=True,
                   help="input folder: <case>_0000<ending> files, one per channel, as for nnUNetv2_predict")
    p.add_argument("-o", dest="output", type=Path, required=True, help="output folder for <case><ending> labels")
    p.add_argument("-m", dest="model", type=Path, required=True,
                   help="export folder written by nnUNetv2_meddisseg_export (holds onnx_model.json)")
    p.add_argument("-f", dest="folds", nargs="+", default=None,
                   help="folds to ensemble (default: every exported fold)")
    p.add_argument("-step_size", type=float, default=None,
                   help="sliding-window step as a fraction of the patch size (default: the exported 0.5)")
    p.add_argument("--disable_tta", action="store_true", help="no mirroring (faster, as nnUNetv2_predict's flag)")
    p.add_argument("--runtime", choices=RUNTIMES, default=None,
                   help="default: onnxruntime where --providers is given, else the first of openvino, onnxruntime "
                        "installed (OpenVINO is the faster on the CPU)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16 and int8 (OpenVINO only) where the export verified them against fp32 "
                        "(nnUNetv2_meddisseg_export --int8 / --bf16); bf16 needs a CPU with native bf16")
    p.add_argument("--providers", nargs="+", default=None,
                   help="ONNX Runtime execution providers in order of preference, e.g. TensorrtExecutionProvider "
                        "CUDAExecutionProvider CPUExecutionProvider (default: CPUExecutionProvider)")
    p.add_argument("--threads", type=int, default=None,
                   help="the runtime's CPU threads: OpenVINO's in all, ONNX Runtime's intra-op threads (default: the "
                        "runtime's choice)")
    p.add_argument("--save_probabilities", action="store_true",
                   help="also write <case>.npz with the class probabilities, as nnUNetv2_predict's flag")
    p.add_argument("--verbose", action="store_true", help="print each case's time")
    return p


def _command(argv: Optional[Sequence[str]]) -> int:
    args = _parser().parse_args(argv)
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    if args.providers is not None and args.runtime == "openvino":
        raise UserError("--providers: ONNX Runtime's execution providers do not apply to --runtime openvino")
    runtime = args.runtime or ("onnxruntime" if args.providers is not None else None)
    predictor = OnnxPredictor(args.model, args.folds, not args.disable_tta, args.step_size,
                              args.providers or ["CPUExecutionProvider"], args.threads, runtime, args.precision)
    written = predictor.predict_folder(args.input, args.output, args.verbose, args.save_probabilities)
    engine = (f"ONNX Runtime providers {', '.join(predictor.providers_in_use)}" if predictor.runtime == "onnxruntime"
              else "OpenVINO CPU")
    print(f"{len(written)} case(s) written to {args.output} (folds {' '.join(predictor.folds)}; {engine}, "
          f"{predictor.precision})")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
