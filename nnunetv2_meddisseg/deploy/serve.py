"""``nnUNetv2_meddisseg_serve``: an exported model as an HTTP service on LitServe, without PyTorch.

LitServe's worker loads the model once and predicts as ``nnUNetv2_meddisseg_predict_onnx`` does, to the same masks; up
to ``--max_batch_size`` requests arriving within ``--batch_timeout_ms`` of the first share the runtime's stacks.

Endpoints: ``POST /predict`` (body: PNG, BMP or TIFF bytes, or a ``.npy`` array (C, X, Y) or (X, Y); optional
``?spacing=1,1``) -> the label map as the predictor writes it (``?probabilities=true``: an ``.npz`` of ``segmentation``
and ``probabilities``); ``GET /health`` (200 once the model is loaded, 503 before and while a crashed worker restarts);
``GET /`` (liveness). Requests are checked in the HTTP process before queueing and logged as one JSON line each on
stderr; a refusal is a 4xx / 503 with body ``{"detail": "..."}``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.deploy.description import check_step_size, read_description
from nnunetv2_meddisseg.deploy.image_pipeline import (
    case_of_images,
    check_finite,
    encode_segmentation,
    preprocess,
    read_image,
)
from nnunetv2_meddisseg.deploy.precision import PRECISIONS, fold_graph
from nnunetv2_meddisseg.deploy.runtimes import RUNTIMES, default_runtime, installed_runtimes
from nnunetv2_meddisseg.errors import UserError

__all__ = ["PROG", "SegmentationAPI", "read_request", "main"]

PROG = "nnUNetv2_meddisseg_serve"
#: seconds the worker waits before it loads the model (tests: the not-ready state, observable)
SETUP_DELAY_ENV = "NNUNETV2_MEDDISSEG_SERVE_SETUP_DELAY_S"
#: the numpy dtype kinds a raw array may have: unsigned and signed integers, floats
ARRAY_KINDS = "uif"
#: how a body's first bytes tell its format, and the file ending it is read as
MAGIC = ((b"\x89PNG\r\n\x1a\n", ".png"), (b"BM", ".bmp"), (b"II*\x00", ".tif"), (b"MM\x00*", ".tif"),
         (b"\x93NUMPY", ".npy"))
#: how often a waiting request checks that the worker that took it is still there
WORKER_POLL_S = 0.25
WORKER_STOPPED = "the inference worker stopped during this request and is being restarted; retry"
MEDIA_TYPES = {".png": "image/png", ".bmp": "image/bmp", ".tif": "image/tiff"}

log = logging.getLogger("nnunetv2_meddisseg.serve")

try:  # the [serve] extra; the command says so in one line where it is missing
    import litserve
    _LitAPI = litserve.LitAPI
except ImportError:
    litserve, _LitAPI = None, object


class RequestError(Exception):
    """A request refused with an HTTP status and one line."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, " ".join(detail.split())


class _JsonLines(logging.Formatter):
    """Each record as one JSON line (a traceback folded into its ``error`` field)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{record.msecs:03.0f}Z",
                 "level": record.levelname.lower(), "logger": record.name, "pid": record.process}
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        else:
            entry["message"] = record.getMessage()
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "info") -> None:
    """Every logger of the process (ours, LitServe's, uvicorn's) as one JSON line per record on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("litserve", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


def read_request(body: bytes, description: dict, spacing: Optional[str] = None) -> np.ndarray:
    """A request's body -> the case (C, 1, X, Y) float32 as the predictor reads it, checked; else RequestError."""
    if not body:
        raise RequestError(400, "empty body: send an image file's bytes (PNG, BMP, TIFF) or a .npy array")
    ending = next((e for magic, e in MAGIC if body.startswith(magic)), None)
    if ending is None:
        raise RequestError(400, f"malformed body: not a PNG, BMP or TIFF image nor a .npy array (first bytes "
                                f"{body[:8]!r})")
    if spacing is not None:
        try:
            values = [float(v) for v in spacing.split(",")]
        except ValueError:
            raise RequestError(400, f"spacing={spacing!r}: expected two numbers, e.g. spacing=1,1") from None
        if values != [float(v) for v in description["spacing"]]:
            raise RequestError(422, f"spacing {values}: the model predicts at spacing {description['spacing']} and "
                                    f"the predictor does not resample; resample the image first")
    try:
        if ending == ".npy":
            case = _case_of_array(body)
        else:
            case = case_of_images([(read_image(Path(f"request{ending}"), body), f"the request's {ending} image")])
    except UserError as e:
        status = 400 if "cannot read" in str(e) else 422
        raise RequestError(status, str(e)) from None
    channels = description["num_input_channels"]
    if case.shape[0] != channels:
        raise RequestError(422, f"the image has {case.shape[0]} channel(s), the model takes {channels}")
    return case


def _case_of_array(body: bytes) -> np.ndarray:
    """A ``.npy`` body (X, Y) or (C, X, Y) of integers or floats -> (C, 1, X, Y) float32."""
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # noqa: BLE001 (numpy's reason is the client's answer)
        raise RequestError(400, f"malformed .npy body ({type(e).__name__}: {e})") from None
    if array.dtype.kind not in ARRAY_KINDS:
        raise RequestError(422, f"array of dtype {array.dtype}: expected integers or floats (e.g. uint8, uint16, "
                                f"float32)")
    if array.ndim not in (2, 3) or 0 in array.shape:
        raise RequestError(422, f"array of shape {array.shape}: expected (X, Y) or (channels, X, Y)")
    case = (array[None] if array.ndim == 2 else array)[:, None].astype(np.float32)
    check_finite(case, Path("the request's array"))
    return case


class SegmentationAPI(_LitAPI):
    """LitServe's API of one model: requests ``{"case": (C, 1, X, Y), "probabilities": bool}`` predicted in batches."""

    def __init__(self, model_dir: Path, options: dict, max_batch_size: int, batch_timeout_s: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout_s, api_path="/predict")
        self.model_dir, self.options = Path(model_dir), options

    def setup(self, device) -> None:
        from nnunetv2_meddisseg.deploy.predict_onnx import OnnxPredictor

        configure_logging(self.options.get("log_level", "info"))
        delay = float(os.environ.get(SETUP_DELAY_ENV, "0") or 0)
        if delay > 0:
            time.sleep(delay)
        start = time.perf_counter()
        o = self.options
        self.predictor = OnnxPredictor(self.model_dir, o["folds"], o["use_mirroring"], o["step_size"],
                                       threads=o["threads"], runtime=o["runtime"], precision=o["precision"])
        log.info("model loaded", extra={"fields": {
            "event": "loaded", "model": str(self.model_dir), "folds": self.predictor.folds,
            "runtime": self.predictor.runtime, "precision": self.predictor.precision_in_use,
            "seconds": round(time.perf_counter() - start, 3)}})

    def predict(self, requests):
        single = isinstance(requests, dict)
        requests = [requests] if single else requests
        description = self.predictor.description
        outputs: List[Optional[Tuple[int, str, bytes]]] = [None] * len(requests)
        prepared = []
        for i, request in enumerate(requests):
            try:
                prepared.append((i, preprocess(request["case"], description, "the request's image")))
            except UserError as e:  # e.g. RGBTo01Normalization's range: this request only
                outputs[i] = (422, "application/json", _detail(e))
        if prepared:
            wanted = any(requests[i]["probabilities"] for i, _ in prepared)
            results = self.predictor.predict_prepared_cases([p for _, p in prepared], wanted)
            for (i, _), result in zip(prepared, results):
                segmentation, probabilities = result if wanted else (result, None)
                if requests[i]["probabilities"]:
                    buffer = io.BytesIO()
                    np.savez_compressed(buffer, segmentation=segmentation, probabilities=probabilities)
                    outputs[i] = (200, "application/octet-stream", buffer.getvalue())
                else:
                    ending = description["file_ending"]
                    outputs[i] = (200, MEDIA_TYPES.get(ending, "application/octet-stream"),
                                  encode_segmentation(segmentation, ending))
        return outputs[0] if single else outputs


def _detail(message) -> bytes:
    return json.dumps({"detail": " ".join(str(message).split())}).encode()


def _server_class():
    """LitServe's server with our ``/predict``, ``/health`` 503 while the worker loads, and a graceful SIGTERM."""
    from litserve.utils import WorkerSetupStatus

    class Server(litserve.LitServer):
        exit_code = 0

        def __init__(self, api, serve_options: dict, description: dict, **kwargs) -> None:
            self.serve_options, self.description = serve_options, description
            super().__init__(api, **kwargs)

        def _register_api_endpoints(self, lit_api, request_type, response_type):
            self.app.add_api_route(lit_api.api_path, _predict_endpoint(self, lit_api), methods=["POST"])

        def verify_worker_status(self):
            # the socket opens at once; /health says 503 until the worker has loaded the model
            def watch():
                while not self._shutdown_event.is_set():
                    if any(v == WorkerSetupStatus.ERROR for v in self.workers_setup_status.values()):
                        log.error("the inference worker could not load the model (its error is logged above); "
                                  "shutting down")
                        Server.exit_code = 1
                        self._shutdown_event.set()
                        return
                    time.sleep(0.1)

            threading.Thread(target=watch, daemon=True, name="serve-setup-watch").start()

        def ready(self) -> bool:
            return bool(self.workers_setup_status) and all(v == WorkerSetupStatus.READY
                                                           for v in self.workers_setup_status.values())

    return Server


def _predict_endpoint(server, lit_api):
    """``POST /predict``: check the body, queue it for the worker, answer its result; one log line per request."""
    from fastapi import Request, Response
    from litserve.utils import LitAPIStatus, ResponseBufferItem
    from starlette.requests import ClientDisconnect

    options = server.serve_options
    handler_state = {"in_flight": 0}

    async def submit(payload):
        uid = str(uuid.uuid4())
        event = asyncio.Event()
        server.response_buffer[uid] = item = ResponseBufferItem(event)
        server._get_request_queue(lit_api.api_path).put((server.app.response_queue_id, uid, time.monotonic(), payload))
        end = time.monotonic() + options["request_timeout_s"]
        try:
            while not event.is_set():
                if time.monotonic() > end:
                    raise RequestError(504, f"no answer within --request_timeout_s {options['request_timeout_s']:g} s")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), min(WORKER_POLL_S, max(end - time.monotonic(), 0.001)))
                # a worker that took this request and is no longer ready died with it (LitServe's monitor restarts
                # it, but marks only the requests of its own process's buffer, not this HTTP process's)
                if not event.is_set() and item.worker_id is not None and not server.ready():
                    raise RequestError(503, WORKER_STOPPED)
        finally:
            server.response_buffer.pop(uid, None)
        response, status = item.response
        if status == LitAPIStatus.ERROR:
            if response is None:  # LitServe's monitor: the worker process died with this request
                raise RequestError(503, WORKER_STOPPED)
            # LitServe sends the worker's exception pickled; it is not unpickled here: the worker logs it
            error = response if isinstance(response, BaseException) else None
            code = getattr(error, "status_code", 500)
            raise RequestError(code, getattr(error, "detail", None) or "prediction failed in the inference worker "
                                                                        "(its log line says why)")
        return response

    async def endpoint(request: Request) -> Response:
        start = time.perf_counter()
        fields = {"event": "request", "path": "/predict", "client": request.client.host if request.client else None}
        body = b""
        try:
            if not server.ready():
                raise RequestError(503, "not ready: the model is loading (GET /health answers 200 once it is)")
            if handler_state["in_flight"] >= options["max_queue"]:
                raise RequestError(503, f"queue full: {handler_state['in_flight']} requests in progress (--max_queue "
                                        f"{options['max_queue']}); retry later")
            handler_state["in_flight"] += 1
            try:
                limit = options["max_request_bytes"]
                declared = request.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise RequestError(413, f"body of {declared} bytes is over --max_request_bytes {limit}")
                chunks, size = [], 0
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise RequestError(413, f"body over --max_request_bytes {limit}")
                    chunks.append(chunk)
                body = b"".join(chunks)
                probabilities = request.query_params.get("probabilities", "false").lower()
                if probabilities not in ("true", "false", "1", "0"):
                    raise RequestError(400, f"probabilities={probabilities!r}: expected true or false")
                case = read_request(body, server.description, request.query_params.get("spacing"))
                fields["image"] = "x".join(str(s) for s in (case.shape[2], case.shape[3], case.shape[0]))
                status, media_type, content = await submit({"case": case,
                                                            "probabilities": probabilities in ("true", "1")})
            finally:
                handler_state["in_flight"] -= 1
        except ClientDisconnect:
            fields.update(status=499, detail="the client disconnected before its body was read",
                          ms=round(1000 * (time.perf_counter() - start), 1))
            log.warning("request", extra={"fields": fields})
            return Response(status_code=499)
        except RequestError as e:
            status, media_type, content = e.status, "application/json", _detail(e.detail)
            fields["detail"] = e.detail
        fields.update(status=status, bytes_in=len(body), bytes_out=len(content),
                      ms=round(1000 * (time.perf_counter() - start), 1))
        (log.info if status < 400 else log.warning)("request", extra={"fields": fields})
        return Response(content=content, status_code=status, media_type=media_type)

    # the classes themselves: FastAPI cannot resolve this module's postponed (string) annotations of local imports
    endpoint.__annotations__ = {"request": Request, "return": Response}
    return endpoint


def _check_model(args) -> Tuple[dict, str]:
    """Check the model folder and options before the worker starts: a bad ``-m`` is one line, not a failing worker."""
    description = read_description(args.model)
    exported = {f["fold"]: f for f in description["folds"]}
    chosen = list(exported) if args.folds is None else [str(f) for f in args.folds]
    unknown = [f for f in chosen if f not in exported]
    if unknown:
        raise UserError(f"{args.model}: fold(s) {', '.join(unknown)} not exported (there: {', '.join(exported)})")
    runtime = args.runtime or default_runtime()
    if runtime not in installed_runtimes():
        raise UserError(f"--runtime {runtime}: it is not installed")
    if args.step_size is not None:
        check_step_size(args.step_size, description["patch_size"], "-step_size")
    for f in chosen:
        fold_graph(args.model, exported[f], args.precision, runtime, description)
    return description, runtime


def _check_port(host: str, port: int) -> None:
    """One line where ``host:port`` cannot be listened on (another server has it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter,
                                description="Serve an exported model (nnUNetv2_meddisseg_export) over HTTP on "
                                            "LitServe: POST /predict an image, get its label map as "
                                            "nnUNetv2_meddisseg_predict_onnx writes it. No PyTorch.")
    p.add_argument("-m", dest="model", type=Path, required=True,
                   help="export folder written by nnUNetv2_meddisseg_export (holds onnx_model.json)")
    p.add_argument("-f", dest="folds", nargs="+", default=None, help="folds to ensemble (default: every exported "
                                                                      "fold)")
    p.add_argument("-step_size", type=float, default=None,
                   help="sliding-window step as a fraction of the patch size (default: the exported 0.5)")
    p.add_argument("--disable_tta", action="store_true", help="no mirroring (as nnUNetv2_predict's flag)")
    p.add_argument("--runtime", choices=RUNTIMES, default=None,
                   help="the runtime the graphs run on (default: the first installed of openvino, onnxruntime)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16 and int8 (OpenVINO only) where the export verified them")
    p.add_argument("--threads", type=int, default=None,
                   help="the runtime's CPU threads (default: the runtime's choice)")
    p.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "0.0.0.0", "::"),
                   help="the address to listen on (0.0.0.0: every interface, e.g. in a container)")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on (1024 to 65535)")
    p.add_argument("--max_batch_size", type=int, default=8,
                   help="most requests whose tiles go to the runtime together")
    p.add_argument("--batch_timeout_ms", type=float, default=10.0,
                   help="the latency bound of batching: how long the first request of a batch waits for others")
    p.add_argument("--max_request_bytes", type=int, default=64 << 20, help="largest request body, in bytes")
    p.add_argument("--request_timeout_s", type=float, default=60.0,
                   help="a request not answered within this many seconds gets 504")
    p.add_argument("--max_queue", type=int, default=64,
                   help="most requests in progress at once (queued or predicted); more get 503")
    p.add_argument("--log_level", default="info", choices=("debug", "info", "warning", "error"),
                   help="the least level of the log lines (one JSON object each, on stderr)")
    return p


def _command(argv: Optional[Sequence[str]]) -> int:
    args = _parser().parse_args(argv)
    for option, value in (("--threads", args.threads), ("--max_batch_size", args.max_batch_size),
                          ("--max_request_bytes", args.max_request_bytes), ("--max_queue", args.max_queue)):
        if value is not None and value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    if not 1024 <= args.port <= 65535:
        raise UserError(f"--port must be from 1024 to 65535, got {args.port}")
    if not (np.isfinite(args.batch_timeout_ms) and args.batch_timeout_ms >= 0):
        raise UserError(f"--batch_timeout_ms must be a number >= 0, got {args.batch_timeout_ms}")
    if not (np.isfinite(args.request_timeout_s) and args.request_timeout_s * 1000 > args.batch_timeout_ms):
        raise UserError(f"--request_timeout_s must be a number above --batch_timeout_ms, got "
                        f"{args.request_timeout_s}")
    if litserve is None:
        raise UserError("the server needs LitServe: pip install 'nnunetv2_meddisseg[serve]'")
    description, runtime = _check_model(args)
    _check_port(args.host, args.port)
    configure_logging(args.log_level)
    from litserve import server as litserve_server

    # LitServe sets its own handler on its logger when it runs: keep every line one JSON line
    litserve_server.configure_logging = lambda *a, **k: configure_logging(args.log_level)
    options = {"folds": args.folds, "use_mirroring": not args.disable_tta, "step_size": args.step_size,
               "threads": args.threads, "runtime": runtime, "precision": args.precision, "log_level": args.log_level}
    api = SegmentationAPI(args.model, options, args.max_batch_size, args.batch_timeout_ms / 1000)
    serve_options = {"max_queue": args.max_queue, "max_request_bytes": args.max_request_bytes,
                     "request_timeout_s": args.request_timeout_s}
    server = _server_class()(api, serve_options, description, accelerator="cpu", workers_per_device=1,
                             timeout=args.request_timeout_s, restart_workers=True, disable_openapi_url=True)
    # uvicorn waits this long for requests in flight when it stops (SIGTERM)
    server.uvicorn_graceful_timeout = args.request_timeout_s + 5

    def stop(signum, frame):
        # LitServe's KeyboardInterrupt shutdown: uvicorn finishes the requests in flight, then the worker stops
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.info("SIGTERM: finishing the requests in flight, then stopping", extra={"fields": {"event": "stopping"}})
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    log.info("serving", extra={"fields": {"event": "start", "host": args.host, "port": args.port,
                                          "model": str(args.model), "runtime": runtime, "precision": args.precision,
                                          "max_batch_size": args.max_batch_size,
                                          "batch_timeout_ms": args.batch_timeout_ms}})
    server.run(host=args.host, port=args.port, num_api_servers=1, generate_client_file=False,
               log_level=args.log_level, api_server_worker_type="process", log_config=None, access_log=False)
    log.info("stopped", extra={"fields": {"event": "stopped", "exit_code": server.exit_code}})
    return server.exit_code


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
