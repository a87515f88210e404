"""``nnUNetv2_meddisseg_predict_onnx``: predict 2D images with an exported model on OpenVINO or ONNX Runtime with numpy
(PyTorch and nnU-Net are not imported).

Input and output as ``nnUNetv2_predict``'s (``<case>_<XXXX><ending>`` files, one per channel -> ``<case><ending>``
labels), with its options for large jobs; the folds are ensembled in fp32 or a verified reduced precision. The model
folder is checked before use, the output folder before anything is written.
"""
from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.deploy.description import check_step_size, read_description
from nnunetv2_meddisseg.deploy.image_pipeline import (
    preprocess,
    probabilities_from_logits,
    read_case,
    restore_probabilities,
    restore_shape,
    segmentation_from_logits,
)
from nnunetv2_meddisseg.deploy.precision import PRECISIONS, fold_session
from nnunetv2_meddisseg.deploy.prediction_output import PredictionOutput, check_folders
from nnunetv2_meddisseg.deploy.runtimes import RUNTIMES, default_runtime
from nnunetv2_meddisseg.deploy.sliding_window import sliding_window_logits, sliding_window_logits_of_cases
from nnunetv2_meddisseg.errors import UserError

__all__ = ["OnnxPredictor", "find_cases", "cases_of_part", "main"]

PROG = "nnUNetv2_meddisseg_predict_onnx"
#: a case of at least this many tiles x folds also gets a bar of its tiles (a very large image takes minutes)
TILE_PROGRESS_MIN = 100

Prepared = Tuple[np.ndarray, dict]


def find_cases(folder: Path, file_ending: str) -> Dict[str, List[Path]]:
    """``{case: its files in channel order}`` of an input folder (``<case>_<XXXX><ending>``), sorted by case."""
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder (expected images named <case>_0000{file_ending})")
    pattern = re.compile(rf"^(.+)_(\d{{4}}){re.escape(file_ending)}$")
    cases: Dict[str, List[Path]] = {}
    for path in sorted(folder.iterdir()):
        match = pattern.match(path.name)
        if match and path.is_file():
            cases.setdefault(match.group(1), []).append(path)
    if not cases:
        raise UserError(f"{folder}: no images named <case>_0000{file_ending}")
    return dict(sorted(cases.items()))


def cases_of_part(cases: Sequence[str], num_parts: int, part_id: int) -> List[str]:
    """Part ``part_id``'s cases, split as ``nnUNetv2_predict`` does: every ``num_parts``-th from the ``part_id``-th."""
    if not (isinstance(num_parts, int) and num_parts >= 1):
        raise UserError(f"-num_parts must be at least 1, got {num_parts}")
    if not (isinstance(part_id, int) and 0 <= part_id < num_parts):
        raise UserError(f"-part_id must be from 0 to {num_parts - 1} (-num_parts {num_parts}; parts count from 0), "
                        f"got {part_id}")
    return list(cases)[part_id::num_parts]


class OnnxPredictor:
    """The exported folds of one model as runtime sessions, and nnU-Net's 2D pipeline around them.

    folds: None for all; precision: ``fp32``, or ``bf16`` / ``int8`` where the export verified them; int8_floats: an
    int8 graph's float precision (None: bf16 where verified and the CPU has it, else fp32); providers: ONNX Runtime's,
    by preference, each a name or ``(name, options)``; threads: the runtime's CPU threads (None: its default)."""

    def __init__(self, model_dir: Path, folds: Optional[Sequence[str]] = None, use_mirroring: bool = True,
                 step_size: Optional[float] = None,
                 providers: Sequence[Union[str, Tuple[str, dict]]] = ("CPUExecutionProvider",),
                 threads: Optional[int] = None, runtime: Optional[str] = None, precision: str = "fp32",
                 int8_floats: Optional[str] = None) -> None:
        self.model_dir = Path(model_dir)
        self.description = description = read_description(self.model_dir)
        exported = {f["fold"]: f for f in description["folds"]}
        chosen = list(exported) if folds is None else [str(f) for f in folds]
        unknown = [f for f in chosen if f not in exported]
        if unknown:
            raise UserError(f"{model_dir}: fold(s) {', '.join(unknown)} not exported (there: {', '.join(exported)})")
        self.mirror_axes = description["mirror_axes"] if use_mirroring else None
        self.step_size = (description["tile_step_size"] if step_size is None
                          else check_step_size(step_size, description["patch_size"], "-step_size"))
        self.runtime = default_runtime() if runtime is None else runtime
        self.precision = precision
        self.sessions = [fold_session(self.model_dir, exported[f], description, self.runtime, precision, providers,
                                      threads, int8_floats) for f in chosen]
        floats = sorted({getattr(s, "floats", "fp32") for s in self.sessions})
        #: what runs: the precision, and an int8 graph's float operations' (``int8 (floats in bf16)``)
        self.precision_in_use = precision + (f" (floats in {'/'.join(floats)})" if precision == "int8" else "")
        self.folds = chosen
        #: the providers ONNX Runtime started (it falls back to the next one, with a warning, where one cannot start)
        self.providers_in_use = getattr(self.sessions[0], "providers_in_use", [])
        self.num_foreground = len([v for v in description["labels"].values() if isinstance(v, int) and v > 0])

    def logits(self, data, progress: Optional[Callable[[int, int], None]] = None):
        """A preprocessed case (C, 1, X, Y) -> the folds' mean logits (K, 1, X, Y); ``progress(tiles, total)``."""
        d = self.description
        return sliding_window_logits(data, self.sessions, d["patch_size"], self.step_size, self.mirror_axes,
                                     d["num_segmentation_heads"], progress)

    def prepare(self, files: Sequence[Path]) -> Prepared:
        """One case's files -> (the network's input (C, 1, X', Y'), the geometry that puts the prediction back)."""
        return preprocess(read_case(files), self.description, str(files[0]))

    def predict_prepared(self, prepared: Prepared, with_probabilities: bool = False,
                         progress: Optional[Callable[[int, int], None]] = None):
        """``predict_files`` of a case that ``prepare`` read."""
        return self._results([self.logits(prepared[0], progress)], [prepared], with_probabilities)[0]

    def predict_prepared_cases(self, cases: Sequence[Prepared], with_probabilities: bool = False,
                               progress: Optional[Callable[[int, int], None]] = None) -> list:
        """``predict_prepared`` of several cases, their tiles stacked together; one result per case, in order."""
        d = self.description
        all_logits = sliding_window_logits_of_cases([data for data, _ in cases], self.sessions, d["patch_size"],
                                                    self.step_size, self.mirror_axes, d["num_segmentation_heads"],
                                                    progress)
        return self._results(all_logits, cases, with_probabilities)

    def _results(self, all_logits, cases: Sequence[Prepared], with_probabilities: bool) -> list:
        """Each case's logits -> its segmentation in the read image's shape (and its probabilities)."""
        d = self.description
        results = []
        for logits, (_, geometry) in zip(all_logits, cases):
            segmentation = restore_shape(segmentation_from_logits(logits, d["regions_class_order"]), geometry, d,
                                         self.num_foreground)
            if not with_probabilities:
                results.append(segmentation)
                continue
            probabilities = probabilities_from_logits(logits, d["regions_class_order"])
            results.append((segmentation, restore_probabilities(probabilities, geometry, d)))
        return results

    def predict_files(self, files: Sequence[Path], with_probabilities: bool = False):
        """One case's channel files -> its segmentation (1, X, Y) in the read image's shape; with
        ``with_probabilities`` also the class probabilities (K, 1, X, Y) float32 as nnU-Net saves them."""
        return self.predict_prepared(self.prepare(files), with_probabilities)

    def _prepared_in_order(self, cases: Sequence[Tuple[str, Sequence[Path]]], ahead: bool
                           ) -> Iterator[Tuple[str, Prepared]]:
        """``(case, prepared)`` in the order of ``cases``. With ``ahead``, the next case is read and preprocessed in
        a background thread while the caller predicts this one; a case's error is raised at its turn either way."""
        if not ahead:
            for case, files in cases:
                yield case, self.prepare(files)
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess") as pool:
            upcoming = ((case, pool.submit(self.prepare, files)) for case, files in cases)  # each submitted at next()
            pending = next(upcoming, None)
            while pending is not None:
                case, future = pending
                prepared = future.result()
                pending = next(upcoming, None)
                yield case, prepared

    def predict_folder(self, input_folder: Path, output_folder: Path, verbose: bool = False,
                       save_probabilities: bool = False, num_parts: int = 1, part_id: int = 0,
                       continue_prediction: bool = False, overwrite: bool = False, progress: bool = False,
                       preprocess_ahead: bool = True) -> List[Path]:
        """``input_folder``'s cases (part ``part_id`` of ``num_parts``) -> ``output_folder/<case><ending>`` (and
        ``<case>.npz`` with ``save_probabilities``); returns the label files written, in order. Output files are checked
        first (``overwrite``: replace files not ours); ``preprocess_ahead``: next case in a background thread."""
        ending = self.description["file_ending"]
        input_folder, output_folder = Path(input_folder), Path(output_folder)
        check_folders(input_folder, output_folder, self.model_dir)
        cases = find_cases(input_folder, ending)
        part = cases_of_part(list(cases), num_parts, part_id)
        output = PredictionOutput(output_folder, ending, save_probabilities)
        todo = output.plan(part, [f for files in cases.values() for f in files], continue_prediction, overwrite)
        if num_parts > 1:
            print(f"part {part_id} of {num_parts} (counting from 0): {len(part)} of {len(cases)} case(s)")
        if continue_prediction:
            print(f"--continue_prediction: {len(part) - len(todo)} case(s) already predicted, {len(todo)} to go")
        bar, tile_bar = contextlib.nullcontext(), None
        if progress:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is optional without PyTorch's stack: no bar then
                progress = False
            else:
                bar, tile_bar = tqdm(total=len(todo), unit="case", desc=PROG, file=sys.stderr), tqdm
        written = []
        with bar, contextlib.closing(self._prepared_in_order([(c, cases[c]) for c in todo],
                                                             preprocess_ahead)) as prepared_cases:
            for case, prepared in prepared_cases:
                start = time.perf_counter()
                with contextlib.closing(_TileBar(tile_bar, case)) as tiles:
                    result = self.predict_prepared(prepared, save_probabilities, tiles)
                segmentation, probabilities = result if save_probabilities else (result, None)
                written.append(output.write(case, segmentation, probabilities))
                if progress:
                    bar.update()
                if verbose:
                    (bar.write if progress else print)(f"{case}: {time.perf_counter() - start:.2f} s")
        return written


class _TileBar:
    """``progress(tiles, total)`` of one case: a bar (``bar``: tqdm's class, or None) from TILE_PROGRESS_MIN tiles."""

    def __init__(self, bar, case: str) -> None:
        self.make, self.case, self.bar = bar, case, None

    def __call__(self, tiles: int, total: int) -> None:
        if self.bar is None:
            if self.make is None or total < TILE_PROGRESS_MIN:
                return
            self.bar = self.make(total=total, unit="tile", desc=f"{self.case} (tiles x folds)", leave=False,
                                 file=sys.stderr, position=1)
        self.bar.update(tiles)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
                   help="the runtime the graphs run on (default: onnxruntime where --providers is given, else the "
                        "first installed of openvino, onnxruntime)")
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
    p.add_argument("-num_parts", type=int, default=1,
                   help="number of separate calls sharing the cases (and one output folder), as nnUNetv2_predict's")
    p.add_argument("-part_id", type=int, default=0,
                   help="which of the -num_parts calls this is, from 0 to num_parts - 1; the cases are split as "
                        "nnUNetv2_predict splits them")
    p.add_argument("--continue_prediction", action="store_true",
                   help="continue an interrupted prediction: skip the cases whose outputs this command wrote and "
                        "are still there unchanged")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing output files that this command did not write (never an input file)")
    p.add_argument("--disable_progress_bar", action="store_true",
                   help="no progress bar (by default it is shown where stderr is a terminal and tqdm is installed)")
    p.add_argument("--sequential", action="store_true",
                   help="read and preprocess each case only after the previous one is written (by default the next "
                        "case is preprocessed in a background thread while this one is predicted)")
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
    written = predictor.predict_folder(args.input, args.output, args.verbose, args.save_probabilities,
                                       args.num_parts, args.part_id, args.continue_prediction, args.overwrite,
                                       progress=not args.disable_progress_bar and sys.stderr.isatty(),
                                       preprocess_ahead=not args.sequential)
    engine = (f"ONNX Runtime providers {', '.join(predictor.providers_in_use)}" if predictor.runtime == "onnxruntime"
              else "OpenVINO CPU")
    print(f"{len(written)} case(s) written to {args.output} (folds {' '.join(predictor.folds)}; {engine}, "
          f"{predictor.precision_in_use})")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
