"""Images per second of ``nnUNetv2_meddisseg_serve`` under concurrent clients against the predictor command run once
over the same images as a folder and called once per image, side by side in one run, per exported model.

``--model NAME=EXPORT_FOLDER ...``: folders ``nnUNetv2_meddisseg_export`` wrote (trained models exported, e.g.
those of ``benchmarks/onnx_predict.py --model``). Without ``--model``: Med-DisSeg and nnU-Net's default network on
the generated ``--size`` dataset of ``benchmarks/predict.py``, untrained and BatchNorm-calibrated (serving cost does
not depend on the weights), each exported in fp32 by ``nnUNetv2_meddisseg_export``; its ``--num-images`` test
images are the images. ``--images``: a folder of ``<case>_0000<ending>`` images (e.g. the first Kvasir-SEG test
images, 256x256), or by default ``--num-images`` generated 256x256 RGB images. For each model,
with the same ``--threads``: (1) ``nnUNetv2_meddisseg_predict_onnx`` once over the folder (the batch bound,
start-up included); (2) the command once per image on the first ``--per-image`` images (how a stream of images is
served without a server); (3) the server started once (start-up not timed), ``--clients`` threads each sending
``--requests`` requests over loopback, the images in turn: images per second over the whole load, each request's
latency (p50, p99), failed requests, and whether every mask the server answered equals the folder command's. The
ratios are of figures measured in the same run on the same machine (other processes may share its CPU: compare
ratios, not absolute figures).
"""
import http.client
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import numpy as np
from common import argument_parser, command_line, machine_info, markdown_table, report

NAME = "serve"
HOST = "127.0.0.1"
#: the targets: throughput against the folder command and against the command per image
TARGET_VS_FOLDER, TARGET_VS_PER_IMAGE = 0.9, 3.0


def _parser():
    p = argument_parser(__doc__, NAME)
    p.add_argument("--model", nargs="+", default=None, metavar="NAME=EXPORT_FOLDER",
                   help="exported models, e.g. MedDisSeg=kvasir_meddisseg_onnx nnUNet=kvasir_default_onnx (default: "
                        "both networks untrained on the generated dataset, exported here)")
    p.add_argument("--size", type=int, default=256, help="without --model: height = width of the generated dataset")
    p.add_argument("--work", type=Path, default=None,
                   help="work folder (default: a temporary folder, removed at the end)")
    p.add_argument("--images", type=Path, default=None, help="folder of <case>_0000<ending> images (default: "
                                                              "--num-images generated 256x256 RGB PNG images)")
    p.add_argument("--num-images", type=int, default=20)
    p.add_argument("--per-image", type=int, default=10, help="images the command is called for one at a time")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=100, help="requests per client")
    p.add_argument("--threads", type=int, default=2, help="the runtime's threads, the same for every arm")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--batch-timeout-ms", type=float, default=10.0)
    p.add_argument("--request-timeout-s", type=float, default=300.0,
                   help="the server's --request_timeout_s: above the queueing of --clients requests, so that a slow "
                        "machine shows in the latencies, not as failures")
    p.add_argument("--disable-tta", action="store_true")
    return p


def _generated_images(folder: Path, count: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        image = rng.integers(0, 256, (256, 256, 3)).astype(np.uint8)
        Image.fromarray(image).save(folder / f"case{i:03d}_0000.png")
    return folder


def _generated_models(args, work: Path) -> Dict[str, Path]:
    """Both networks untrained (BatchNorm-calibrated) on ``benchmarks/predict.py``'s generated dataset, exported in
    fp32; their test images become ``args.images``."""
    import argparse

    import predict  # benchmarks/predict.py: the generated dataset and the untrained model folders

    from nnunetv2_meddisseg.logged_command import run_logged

    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    setup = argparse.Namespace(size=args.size, num_images=args.num_images, plans="nnUNetMedDisSegPlans",
                               baseline_trainer="nnUNetTrainer", baseline_plans="nnUNetPlans",
                               trainer="nnUNetTrainerMedDisSeg", fold="0", checkpoint="checkpoint_final.pth")
    env, dataset = predict._prepare_generated(setup, work, logs)
    raw = next(Path(env["nnUNet_raw"]).glob(f"Dataset{int(dataset):03d}_*"))
    args.images = raw / "imagesTs"
    models = {}
    for name, trainer, plans in (("Med-DisSeg", setup.trainer, setup.plans),
                                 ("nnU-Net default", setup.baseline_trainer, setup.baseline_plans)):
        models[name] = work / "export" / name.replace(" ", "_")
        print(f"[4/4] exporting {name} -> {models[name]}")
        run_logged(["nnUNetv2_meddisseg_export", "-d", dataset, "-tr", trainer, "-p", plans, "-c", "2d", "-f", "0",
                    "-chk", setup.checkpoint, "-o", str(models[name])], env,
                   logs / f"export_{name.replace(' ', '_')}.log")
    return models


def _command(*args: str) -> List[str]:
    return [sys.executable, "-m", "nnunetv2_meddisseg.deploy.predict_onnx", *args]


def _timed(argv: List[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _post(port: int, body: bytes):
    connection = http.client.HTTPConnection(HOST, port, timeout=600)
    try:
        connection.request("POST", "/predict", body=body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _wait_ready(proc: subprocess.Popen, port: int, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server stopped before it was ready (exit {proc.returncode})")
        try:
            connection = http.client.HTTPConnection(HOST, port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready after {timeout} s")


def measure(name: str, model: Path, images: Path, args, work: Path) -> Dict[str, object]:
    """One model's three arms (module docstring)."""
    from PIL import Image

    files = sorted(images.iterdir())
    common = ["-m", str(model), "--threads", str(args.threads), "--disable_progress_bar"] + \
        (["--disable_tta"] if args.disable_tta else [])
    folder_out = work / f"{name}_folder"
    folder_s = _timed(_command("-i", str(images), "-o", str(folder_out), *common))
    per_image_s = []
    for f in files[:args.per_image]:
        single = work / f"{name}_single_{f.name}"
        single.mkdir()
        (single / f.name).write_bytes(f.read_bytes())
        per_image_s.append(_timed(_command("-i", str(single), "-o", str(work / f"{name}_single_out_{f.name}"),
                                           *common)))
    expected = {f.name: np.asarray(Image.open(folder_out / (f.name.rsplit("_0000", 1)[0] + f.suffix)))
                for f in files}
    bodies = [(f.name, f.read_bytes()) for f in files]
    port = _free_port()
    serve_args = [sys.executable, "-m", "nnunetv2_meddisseg.deploy.serve", "-m", str(model), "--port", str(port),
                  "--threads", str(args.threads), "--max_batch_size", str(args.max_batch_size), "--batch_timeout_ms",
                  str(args.batch_timeout_ms), "--max_queue", str(max(64, 2 * args.clients)),
                  "--request_timeout_s", str(args.request_timeout_s)] + \
        (["--disable_tta"] if args.disable_tta else [])
    with open(work / f"{name}_server.log", "w") as log:
        proc = subprocess.Popen(serve_args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(proc, port)

        def client(k: int):
            results = []
            for i in range(args.requests):
                file_name, body = bodies[(k * args.requests + i) % len(bodies)]
                start = time.perf_counter()
                try:
                    status, answer = _post(port, body)
                except OSError:
                    status, answer = None, b""
                ms = 1000 * (time.perf_counter() - start)
                same = status == 200 and np.array_equal(np.asarray(Image.open(io.BytesIO(answer))),
                                                        expected[file_name])
                results.append((status, ms, same))
            return results

        start = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = [r for rs in pool.map(client, range(args.clients)) for r in rs]
        served_s = time.perf_counter() - start
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
    latencies = [ms for status, ms, _ in results if status == 200]
    failed = sum(status != 200 for status, _, _ in results)
    failed_by_status = {str(k): v for k, v in sorted(Counter("no answer" if status is None else status
                                                             for status, _, _ in results if status != 200).items(),
                                                     key=lambda kv: str(kv[0]))}
    served = len(results) / served_s
    folder = len(files) / folder_s
    per_image = len(per_image_s) / sum(per_image_s) if per_image_s else float("nan")
    return {"images_per_s": round(served, 3), "vs_folder_command": round(served / folder, 3),
            "vs_command_per_image": round(served / per_image, 3),
            "p50_ms": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
            "p99_ms": round(float(np.percentile(latencies, 99)), 1) if latencies else None,
            "failed_requests": failed, "failed_by_status": failed_by_status, "clients": args.clients,
            "requests": len(results),
            "masks_identical_to_folder_command": sum(same for _, _, same in results),
            "folder_command_images_per_s": round(folder, 3), "folder_images": len(files),
            "command_per_image_images_per_s": round(per_image, 3), "command_per_image_images": len(per_image_s)}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    # as typed: the generated dataset's folder (a temporary one) is not recorded
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("work", "out")}
    with tempfile.TemporaryDirectory(prefix="serve_bench_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        models = ({name: Path(folder) for name, folder in (m.split("=", 1) for m in args.model)} if args.model
                  else _generated_models(args, work))
        images = args.images or _generated_images(work / "images", args.num_images)
        runs = Path(tempfile.mkdtemp(prefix="runs_", dir=work))  # never a folder that was there before
        results = {name: measure(name.replace(" ", "_"), folder, Path(images), args, runs)
                   for name, folder in models.items()}
    payload = {"machine": machine_info(), "command": command_line(),
               "note": "other processes may share this CPU: the ratios are side by side in one run",
               "settings": settings,
               "results": results}
    rows = [[name, r["images_per_s"], f"{r['vs_folder_command']}x", f"{r['vs_command_per_image']}x", r["p50_ms"],
             r["p99_ms"], r["failed_requests"], f"{r['masks_identical_to_folder_command']}/{r['requests']}"]
            for name, r in results.items()]
    body = markdown_table(["network", "server images/s", "vs folder command", "vs command per image", "p50 ms",
                           "p99 ms", "failed", "masks identical"], rows)
    missed = [f"{name}: {why}" for name, r in results.items() for why, bad in (
        (f"{r['failed_requests']} failed requests", r["failed_requests"] > 0),
        (f"{r['vs_folder_command']}x the folder command (target {TARGET_VS_FOLDER}x)",
         r["vs_folder_command"] < TARGET_VS_FOLDER),
        (f"{r['vs_command_per_image']}x the command per image (target {TARGET_VS_PER_IMAGE}x)",
         r["vs_command_per_image"] < TARGET_VS_PER_IMAGE),
        ("masks differ from the folder command's", r["masks_identical_to_folder_command"] != r["requests"])) if bad]
    return report(Path(args.out), NAME, payload, body, "; ".join(missed) or None)


if __name__ == "__main__":
    sys.exit(main())
