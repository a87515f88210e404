"""nnUNetv2_meddisseg_serve on a tiny export of 2 folds with mirroring, started as a real server on a free
loopback port in a process where importing PyTorch, nnU-Net and onnx fails: readiness before and after the model
is loaded, the masks (and probabilities) nnUNetv2_meddisseg_predict_onnx writes for the same images, concurrent
clients, every bad request with its status and one line (and a good request answered after it), a full queue, a
request over its timeout (504; its late mask reaches no other request), a killed inference worker (not ready,
restarted, right masks again) and SIGTERM with a request in flight (it is answered). Each server is stopped by
the test, also where it fails."""
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scratch import scratch_folder
from test_predict_onnx import BLOCKER
from tiny_export import export_tiny, write_cases

from nnunetv2_meddisseg.deploy import predict_onnx
from nnunetv2_meddisseg.deploy.serve import SETUP_DELAY_ENV, main

pytest.importorskip("litserve")

HOST = "127.0.0.1"
CASES = ("case0", "case1", "case2")
#: a case that takes the tiny model a few seconds of CPU (its tiles x 4 mirrorings x 2 folds)
SLOW_SHAPE = (224, 224, 3)
#: CPU time after which a worker is surely predicting the slow case, well before it is done
CPU_WHEN_BUSY_S = 0.3
MAX_REQUEST_BYTES = 200_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """The command as a process of its own session (its workers with it), stopped by :meth:`stop`."""

    def __init__(self, tmp: Path, *options: str, setup_delay: float = 0) -> None:
        self.port = _free_port()
        self.log_path = tmp / f"server-{self.port}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp / "blocker"), os.environ.get("PYTHONPATH", "")]),
               SETUP_DELAY_ENV: str(setup_delay)}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nnunetv2_meddisseg.deploy.serve", "-m", str(tmp / "model"), "--port",
                 str(self.port), "--threads", "1", *options], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def request(self, method: str, path: str, body: bytes = None, timeout: float = 60):
        """(status, body) of one request; None where nothing listens yet."""
        connection = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            return response.status, response.read()
        except ConnectionRefusedError:
            return None
        finally:
            connection.close()

    def predict(self, body: bytes, query: str = "", timeout: float = 60):
        return self.request("POST", "/predict" + query, body, timeout)

    def wait_ready(self, timeout: float = 90) -> list:
        """The /health statuses seen until it answers 200."""
        seen, end = [], time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log()
            answer = self.request("GET", "/health", timeout=5)
            if answer is not None:
                seen.append(answer[0])
                if answer[0] == 200:
                    return seen
            time.sleep(0.1)
        raise AssertionError(f"not ready after {timeout} s: {seen[-5:]}\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its session is left
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture(scope="module")
def exported(request, tmp_path_factory) -> Path:
    tmp = scratch_folder(request, tmp_path_factory, "serve")
    export_tiny(tmp / "model")
    write_cases(tmp / "in", CASES)
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, SLOW_SHAPE).astype(np.uint8)).save(tmp / "slow.png")
    (tmp / "blocker").mkdir()
    (tmp / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    assert predict_onnx.main(["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"),
                              "--save_probabilities", "--threads", "1"]) == 0
    return tmp


@pytest.fixture(scope="module")
def server(exported):
    """One server for the tests that leave it running: ready only after a load that takes 2 s."""
    started = Server(exported, "--max_request_bytes", str(MAX_REQUEST_BYTES), setup_delay=2)
    try:
        started.seen_before_ready = started.wait_ready()
        yield started
    finally:
        started.stop()


def _image(exported: Path, case: str) -> bytes:
    return (exported / "in" / f"{case}_0000.png").read_bytes()


def _expected(exported: Path, case: str) -> np.ndarray:
    return np.asarray(Image.open(exported / "out" / f"{case}.png"))


def _mask(body: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(body)))


def _one_line(body: bytes) -> str:
    text = body.decode()
    assert text.count("\n") == 0 and json.loads(text).keys() == {"detail"}, text
    return json.loads(text)["detail"]


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.e2e
def test_ready_only_once_loaded_and_masks_are_the_predictors(server, exported):
    assert 503 in server.seen_before_ready  # the socket answered while the model was loading
    assert "torch" not in server.log()  # the blocker let nothing import it
    for case in CASES:
        status, body = server.predict(_image(exported, case))
        assert status == 200, body
        mask, expected = _mask(body), _expected(exported, case)
        assert mask.dtype == expected.dtype == np.uint8 and np.array_equal(mask, expected)
        assert 0 < expected.sum() < expected.size  # both labels: the comparison is not trivial
        # the same image as a raw array (C, X, Y) with its spacing
        pixels = np.asarray(Image.open(exported / "in" / f"{case}_0000.png")).transpose(2, 0, 1)
        status, body = server.predict(_npy(pixels), "?spacing=1,1")
        assert status == 200 and np.array_equal(_mask(body), expected)
        status, body = server.predict(_image(exported, case), "?probabilities=true")
        assert status == 200
        with np.load(io.BytesIO(body)) as answer, np.load(exported / "out" / f"{case}.npz") as written:
            assert np.array_equal(answer["segmentation"][0], expected)
            assert np.array_equal(answer["probabilities"], written["probabilities"])
    lines = [json.loads(line) for line in server.log().splitlines()]  # every log line one JSON object
    assert any(e.get("event") == "loaded" for e in lines)
    assert sum(e.get("event") == "request" and e.get("status") == 200 for e in lines) >= 9


@pytest.mark.e2e
def test_concurrent_clients_get_their_own_masks(server, exported):
    def client(k: int):
        answers = []
        for i in range(5):
            case = CASES[(k + i) % len(CASES)]
            status, body = server.predict(_image(exported, case))
            answers.append((case, status, body))
        return answers

    with ThreadPoolExecutor(8) as pool:
        answers = [a for result in pool.map(client, range(8)) for a in result]
    assert len(answers) == 40
    for case, status, body in answers:
        assert status == 200, body
        assert np.array_equal(_mask(body), _expected(exported, case))


def _disconnect_mid_body(port: int) -> None:
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"\x89PNG" * 100)


BAD_REQUESTS = [
    ("malformed", lambda e: b"not an image at all", 400, "malformed body"),
    ("truncated_png", lambda e: _image(e, "case1")[:40], 400, "cannot read the image"),
    ("bad_npy", lambda e: b"\x93NUMPY garbage", 400, "malformed .npy body"),
    ("empty", lambda e: b"", 400, "empty body"),
    ("wrong_dtype", lambda e: _npy(np.zeros((3, 8, 8), np.complex64)), 422, "dtype complex64"),
    ("bool_dtype", lambda e: _npy(np.zeros((3, 8, 8), bool)), 422, "dtype bool"),
    ("wrong_channels", lambda e: _npy(np.zeros((2, 8, 8), np.uint8)), 422, "2 channel(s), the model takes 3"),
    ("grey_png", lambda e: _png(np.zeros((8, 8), np.uint8)), 422, "1 channel(s), the model takes 3"),
    ("wrong_dimensionality", lambda e: _npy(np.zeros((1, 3, 8, 8), np.uint8)), 422, "expected (X, Y) or"),
    ("nan", lambda e: _npy(np.full((3, 8, 8), np.nan, np.float32)), 422, "NaN"),
    ("wrong_spacing", lambda e: _image(e, "case1"), 422, "does not resample"),
    ("over_the_limit", lambda e: b"\x89PNG" + bytes(MAX_REQUEST_BYTES), 413, "over --max_request_bytes"),
]


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.e2e
@pytest.mark.parametrize("name,body,status,detail", BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS])
def test_bad_request_is_refused_in_one_line_and_the_server_goes_on(server, exported, name, body, status, detail):
    query = "?spacing=0.5,0.5" if name == "wrong_spacing" else ""
    got, answer = server.predict(body(exported), query)
    assert got == status and detail in _one_line(answer), answer
    good, mask = server.predict(_image(exported, "case2"))
    assert good == 200 and np.array_equal(_mask(mask), _expected(exported, "case2"))


@pytest.mark.e2e
def test_client_disconnecting_mid_body_is_logged_and_the_server_goes_on(server, exported):
    _disconnect_mid_body(server.port)
    good, mask = server.predict(_image(exported, "case0"))
    assert good == 200 and np.array_equal(_mask(mask), _expected(exported, "case0"))
    end = time.monotonic() + 10
    while time.monotonic() < end and '"status": 499' not in server.log():
        time.sleep(0.1)
    assert '"status": 499' in server.log()


def _worker_pids(proc: subprocess.Popen) -> list:
    """LitServe's inference workers (spawned children of the server's process)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _cpu_seconds(pid: int) -> float:
    """User and system time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_predicting(pid: int, timeout: float = 30) -> None:
    """Return once the worker has spent CPU_WHEN_BUSY_S on a request: a fixed sleep races a fast machine."""
    start, end = _cpu_seconds(pid), time.monotonic() + timeout
    while _cpu_seconds(pid) - start < CPU_WHEN_BUSY_S:
        assert time.monotonic() < end, f"worker {pid} did not start predicting within {timeout} s"
        time.sleep(0.02)


@pytest.mark.e2e
def test_full_queue_killed_worker_and_sigterm_with_a_request_in_flight(exported):
    server = Server(exported, "--max_queue", "2", "--max_batch_size", "1")
    try:
        server.wait_ready()
        slow = (exported / "slow.png").read_bytes()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: server.predict(slow), range(4)))
        statuses = sorted(a[0] for a in answers)
        assert statuses.count(200) >= 1 and 503 in statuses, statuses
        assert all("queue full" in _one_line(body) for status, body in answers if status == 503)

        # a killed inference worker: its request gets 503, /health says not ready until it is restarted
        workers = _worker_pids(server.proc)
        assert len(workers) == 1
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(server.predict, slow)
            _wait_until_predicting(workers[0])
            os.kill(workers[0], signal.SIGKILL)
            status, body = in_flight.result(60)
        assert status == 503 and "restarted" in _one_line(body)
        seen = server.wait_ready()
        assert _worker_pids(server.proc) not in ([], workers)
        good, mask = server.predict(_image(exported, "case1"))
        assert good == 200 and np.array_equal(_mask(mask), _expected(exported, "case1"))
        del seen

        # SIGTERM while a slow request is predicted: it is answered, then the server stops
        result = {}
        client = threading.Thread(target=lambda: result.update(answer=server.predict(slow)))
        client.start()
        _wait_until_predicting(_worker_pids(server.proc)[0])
        server.proc.send_signal(signal.SIGTERM)
        client.join(60)
        assert result["answer"][0] == 200
        assert server.proc.wait(60) == 0
        assert '"event": "stopping"' in server.log()
    finally:
        server.stop()


@pytest.mark.e2e
def test_a_request_over_its_timeout_gets_504_and_its_late_mask_reaches_nobody(exported):
    server = Server(exported, "--request_timeout_s", "0.3", "--max_batch_size", "1")
    try:
        server.wait_ready()
        status, body = server.predict((exported / "slow.png").read_bytes())
        assert status == 504 and "no answer within --request_timeout_s 0.3 s" in _one_line(body)
        # the slow case is still being predicted; the next request waits for it, then gets its own mask
        end = time.monotonic() + 60
        while (answer := server.predict(_image(exported, "case1")))[0] == 504 and time.monotonic() < end:
            pass
        assert answer[0] == 200 and np.array_equal(_mask(answer[1]), _expected(exported, "case1"))
        assert server.request("GET", "/health")[0] == 200
        log = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        assert [r["status"] for r in log if r.get("event") == "request"][0] == 504
    finally:
        server.stop()


def test_bad_options_are_one_line(exported, capsys, tmp_path):
    cases = [(["-m", str(tmp_path / "nowhere")], "no onnx_model.json"),
             (["-m", str(exported / "model"), "-f", "7"], "fold(s) 7 not exported"),
             (["-m", str(exported / "model"), "--port", "80"], "--port must be from 1024 to 65535"),
             (["-m", str(exported / "model"), "--max_batch_size", "0"], "--max_batch_size must be at least 1"),
             (["-m", str(exported / "model"), "--precision", "int8"], "not verified in int8")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("nnUNetv2_meddisseg_serve: error: ") and message in err, err
