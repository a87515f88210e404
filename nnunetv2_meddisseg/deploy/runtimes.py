"""The graphs' runtimes, ONNX Runtime and OpenVINO, behind one interface (each imported at first use; no PyTorch).

A session holds one fold's graph: ``run(batch (N, C, H, W) float32) -> logits (N, K, H, W) float32``; its input / output
shapes hold ``None`` where symbolic. Every tile runs alone on the same compiled graph, so its logits never depend on the
tiles stacked with it, as each of the server's stacked requests must get the predictor command's mask: kernels chosen by
batch size or performance hint differ in the last bits, flipping pixels where two classes' logits nearly tie.

- ONNX Runtime: the session as given (providers, intra-op threads), one tile per call.
- OpenVINO (CPU): static shapes, compiled per input shape at first use with the THROUGHPUT hint, one tile per request,
  as many in flight as streams. The inference precision is set explicitly (the CPU plugin defaults to bf16 where the CPU
  has it); an INT8 graph's unquantized operations run in fp32, or bf16 with ``floats="bf16"``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from nnunetv2_meddisseg.errors import UserError

__all__ = ["RUNTIMES", "INFERENCE_PRECISION", "installed_runtimes", "default_runtime", "openvino_core",
           "read_openvino_model", "openvino_has_bf16", "require_bf16", "INT8_FLOATS", "OnnxRuntimeSession",
           "OpenVinoSession"]

#: the runtimes in order of preference (benchmarks/onnx_predict.py times both side by side)
RUNTIMES = ("openvino", "onnxruntime")
_EXTRAS = {"openvino": "openvino", "onnxruntime": "onnx"}
#: OpenVINO's inference precision per float precision (an int8 graph's unquantized operations run in it too)
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16"}
#: the precisions an int8 graph's float operations may run in
INT8_FLOATS = tuple(INFERENCE_PRECISION)

Shape = Tuple[Optional[int], ...]


def installed_runtimes() -> List[str]:
    """The runtimes of RUNTIMES that can be imported here."""
    return [name for name in RUNTIMES if importlib.util.find_spec(name) is not None]


def default_runtime() -> str:
    """The first installed runtime of RUNTIMES; a one-line error where neither is."""
    installed = installed_runtimes()
    if not installed:
        raise UserError("neither openvino nor onnxruntime is installed: pip install 'nnunetv2_meddisseg[openvino]' "
                        "(or [onnx])")
    return installed[0]


def _import(runtime: str):
    try:
        return importlib.import_module(runtime)
    except ImportError as e:
        raise UserError(f"--runtime {runtime}: {runtime} is not installed: pip install "
                        f"'nnunetv2_meddisseg[{_EXTRAS[runtime]}]'") from e


_CORE = None


def openvino_core():
    """The process's OpenVINO ``Core`` (made once: each one loads the device plugins anew)."""
    global _CORE
    if _CORE is None:
        _CORE = _import("openvino").Core()
    return _CORE


def read_openvino_model(model: bytes, weights: Optional[bytes] = None):
    """An ``openvino.Model`` from checked bytes: an ONNX graph, or an IR's XML with its ``.bin`` ``weights``."""
    if weights is None:
        return openvino_core().read_model(model)
    return openvino_core().read_model(model, _import("openvino").Tensor(np.frombuffer(weights, dtype=np.uint8).copy()))


def _cpu_capabilities() -> List[str]:
    """OpenVINO's CPU plugin's ``OPTIMIZATION_CAPABILITIES`` (``BF16`` where the CPU has native bf16)."""
    return list(openvino_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def openvino_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively, as OpenVINO's CPU plugin reports it (AVX512-BF16 or AMX)."""
    return "BF16" in _cpu_capabilities()


def require_bf16(what: str = "--precision bf16") -> None:
    """Refuse in one line, starting with ``what``, a CPU without native bf16 (OpenVINO would quietly run fp32)."""
    if not openvino_has_bf16():
        raise UserError(f"{what}: this CPU has no native bf16 (OpenVINO's CPU capabilities: "
                        f"{', '.join(_cpu_capabilities())}); use fp32 or int8")


def _shape(dims) -> Shape:
    return tuple(d if isinstance(d, int) else None for d in dims)


class OnnxRuntimeSession:
    """One graph in ONNX Runtime; providers by preference, each a name or ``(name, options)``; threads: intra-op."""

    runtime = "onnxruntime"
    precision = "fp32"

    def __init__(self, path: Union[Path, bytes],
                 providers: Sequence[Union[str, Tuple[str, dict]]] = ("CPUExecutionProvider",),
                 threads: Optional[int] = None) -> None:
        ort = _import("onnxruntime")
        available = ort.get_available_providers()
        missing = [name for name in (p if isinstance(p, str) else p[0] for p in providers) if name not in available]
        if missing:
            raise UserError(f"--providers: {', '.join(missing)} not available in this onnxruntime "
                            f"(available: {', '.join(available)})")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(path if isinstance(path, bytes) else str(path), options,
                                             providers=list(providers))
        self.input_names = [i.name for i in self._session.get_inputs()]
        self._input = self.input_names[0]
        self.input_shape: Shape = _shape(self._session.get_inputs()[0].shape)
        self.output_shape: Shape = _shape(self._session.get_outputs()[0].shape)

    @property
    def providers_in_use(self) -> List[str]:
        """The providers ONNX Runtime started (it passes over one that cannot start, with a warning)."""
        return self._session.get_providers()

    def run(self, batch: np.ndarray) -> np.ndarray:
        """batch (N, C, H, W) float32 -> logits (N, K, H, W) float32, one tile per call (module docstring)."""
        parts = [self._session.run(None, {self._input: np.ascontiguousarray(batch[i:i + 1])})[0]
                 for i in range(len(batch))]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class OpenVinoSession:
    """One graph (ONNX or IR file, or an ``openvino.Model``) on OpenVINO's CPU in ``precision``, an int8 graph's floats
    in ``floats``; threads: in all (None: every core). bf16 without native bf16 is refused (OpenVINO would run fp32)."""

    runtime = "openvino"

    def __init__(self, model: Union[Path, object], precision: str = "fp32", threads: Optional[int] = None,
                 floats: str = "fp32") -> None:
        if precision not in (*INFERENCE_PRECISION, "int8"):
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(INFERENCE_PRECISION)}, int8")
        if floats not in INT8_FLOATS or (floats != "fp32" and precision != "int8"):
            raise ValueError(f"floats {floats!r}: an int8 graph's float operations run in one of "
                             f"{', '.join(INT8_FLOATS)}; other precisions in their own")
        #: the precision of the graph's operations that are not quantized (an int8 graph's; others: ``precision``)
        self.floats = floats if precision == "int8" else precision
        if self.floats == "bf16":
            require_bf16("--precision bf16" if precision == "bf16" else "int8 with bf16 float operations")
        self._model = openvino_core().read_model(str(model)) if isinstance(model, (str, Path)) else model
        self.precision = precision
        #: OpenVINO's inference precision (``INFERENCE_PRECISION_HINT``) the session compiles with
        self.inference_precision = INFERENCE_PRECISION[self.floats]
        self.input_names = [port.get_any_name() for port in self._model.inputs]
        self._config = {"INFERENCE_PRECISION_HINT": self.inference_precision}
        if threads is not None:
            self._config["INFERENCE_NUM_THREADS"] = threads
        self.input_shape: Shape = _shape(d.get_length() if d.is_static else None
                                         for d in self._model.input(0).get_partial_shape())
        self.output_shape: Shape = _shape(d.get_length() if d.is_static else None
                                          for d in self._model.output(0).get_partial_shape())
        self._compiled: Dict[Tuple[int, ...], object] = {}

    def _queue(self, shape: Tuple[int, ...]):
        """The inference requests of the model compiled for one input shape (at its first use)."""
        if shape not in self._compiled:
            model = self._model.clone()
            model.reshape({0: list(shape)})
            compiled = openvino_core().compile_model(model, "CPU", {**self._config, "PERFORMANCE_HINT": "THROUGHPUT"})
            jobs = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
            self._compiled[shape] = _import("openvino").AsyncInferQueue(compiled, max(jobs, 1))
        return self._compiled[shape]

    def run(self, batch: np.ndarray) -> np.ndarray:
        """batch (N, C, H, W) float32 -> logits (N, K, H, W) float32; a tile per request, one in flight per stream."""
        queue = self._queue((1, *batch.shape[1:]))
        results: List[Optional[np.ndarray]] = [None] * len(batch)

        def done(request, index: int) -> None:
            results[index] = request.get_output_tensor(0).data.copy()

        queue.set_callback(done)
        for i in range(len(batch)):
            queue.start_async({0: np.ascontiguousarray(batch[i:i + 1])}, i)
        queue.wait_all()
        return np.concatenate(results)
