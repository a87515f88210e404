"""Send images to ``nnUNetv2_meddisseg_serve`` and write the label maps it answers, with the standard library only.

    nnUNetv2_meddisseg_serve -m kvasir_onnx --port 8000 &
    python examples/serve_client.py --url http://127.0.0.1:8000 -o masks image1.png image2.png

Each image file's bytes are the request's body (PNG, BMP or TIFF, as the predictor reads them); the answer is the
label map encoded as ``nnUNetv2_meddisseg_predict_onnx`` writes it. A refused request prints its status and the
server's one line and the client goes on with the next image.
"""
import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


def wait_ready(host: str, port: int, timeout: float = 120) -> None:
    """Until ``GET /health`` answers 200 (the model loaded and its graphs checked)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            connection = http.client.HTTPConnection(host, port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server at {host}:{port} was not ready within {timeout} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("images", nargs="+", type=Path)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("-o", dest="output", type=Path, default=Path("masks"))
    args = p.parse_args()
    url = urlsplit(args.url)
    wait_ready(url.hostname, url.port or 80)
    args.output.mkdir(parents=True, exist_ok=True)
    failed = 0
    for image in args.images:
        connection = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=300)
        connection.request("POST", "/predict", body=image.read_bytes())
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            failed += 1
            print(f"{image}: {response.status} {json.loads(body)['detail']}", file=sys.stderr)
            continue
        ending = {"image/png": ".png", "image/bmp": ".bmp", "image/tiff": ".tif"}[response.getheader("content-type")]
        target = args.output / (image.name.rsplit("_0000", 1)[0].rsplit(".", 1)[0] + ending)
        target.write_bytes(body)
        print(f"{image} -> {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
