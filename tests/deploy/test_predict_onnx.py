"""nnUNetv2_meddisseg_predict_onnx on a tiny exported network: it runs in a process where importing PyTorch (and
nnU-Net) fails, writes what the in-process predictor computes, and reports bad input in one line. Its equality
with nnUNetv2_predict on trained models is in tests/e2e/test_onnx_deploy.py."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_export import export_tiny, write_cases

from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, fold_model_file
from nnunetv2_meddisseg.deploy.predict_onnx import PROG, OnnxPredictor, main

BLOCKER = '''import sys


class _Blocked:
    """Refuses to import PyTorch and nnU-Net in this process."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "nnunetv2"):
            raise ImportError(f"{name} is blocked in this process")
        return None


sys.meta_path.insert(0, _Blocked())
'''


@pytest.fixture
def exported(tmp_path) -> Path:
    export_tiny(tmp_path / "model")
    write_cases(tmp_path / "in")
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    return tmp_path


def _without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
@pytest.mark.parametrize("tta", [True, False], ids=["mirroring", "no_mirroring"])
def test_runs_where_torch_cannot_be_imported(exported, tta):
    tmp = exported
    blocked = _without_torch(tmp, "-c", "import torch")
    assert blocked.returncode != 0 and "torch is blocked" in blocked.stderr  # the blocker works
    args = ["-m", "nnunetv2_meddisseg.deploy.predict_onnx", "-i", str(tmp / "in"), "-o", str(tmp / "out"),
            "-m", str(tmp / "model"), "--threads", "1"] + ([] if tta else ["--disable_tta"])
    proc = _without_torch(tmp, *args)
    assert proc.returncode == 0, proc.stderr
    assert "3 case(s) written" in proc.stdout
    predictor = OnnxPredictor(tmp / "model", use_mirroring=tta, threads=1)
    for i in range(3):
        written = np.asarray(Image.open(tmp / "out" / f"case{i}.png"))
        expected = predictor.predict_files([tmp / "in" / f"case{i}_0000.png"])[0]
        assert written.dtype == np.uint8 and np.array_equal(written, expected)
        assert 0 < written.sum() < written.size  # both labels occur: the comparison is not trivial


def test_bad_input_is_one_line(exported, capsys):
    tmp = exported
    cases = [
        (["-i", str(tmp / "nowhere"), "-o", str(tmp / "out"), "-m", str(tmp / "model")], "nowhere: not a folder"),
        (["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "in")], f"no {DESCRIPTION_FILE}"),
        (["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "-f", "3"],
         "fold(s) 3 not exported"),
        (["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--providers", "NoSuchProvider"],
         "--providers: NoSuchProvider not available"),
        (["-i", str(tmp / "model"), "-o", str(tmp / "out"), "-m", str(tmp / "model")], "no images named"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: ") and message in err, err
    (tmp / "model" / fold_model_file(1)).unlink()
    assert main(["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model")]) == 2
    assert "fold_1/model.onnx: missing" in capsys.readouterr().err
    assert not (tmp / "out").exists()  # nothing written by a refused command


def test_providers_with_options_and_the_ones_in_use(exported, capsys, monkeypatch):
    """Providers given as ``(name, options)`` reach ONNX Runtime's sessions as given, one it lacks is refused by
    name, and the command names the providers ONNX Runtime started."""
    import onnxruntime

    tmp, given, real = exported, [], onnxruntime.InferenceSession

    def session(path, options=None, providers=None):
        given.append(providers)
        return real(path, options, providers=providers)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    entry = ("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested"})
    predictor = OnnxPredictor(tmp / "model", providers=[entry])
    assert given == [[entry], [entry]]  # one session per fold
    assert predictor.providers_in_use == ["CPUExecutionProvider"]
    with pytest.raises(Exception, match="NoSuchProvider not available"):
        OnnxPredictor(tmp / "model", providers=[("NoSuchProvider", {}), "CPUExecutionProvider"])
    assert main(["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--threads", "1"]) == 0
    assert "providers CPUExecutionProvider" in capsys.readouterr().out
