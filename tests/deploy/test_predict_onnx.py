"""nnUNetv2_meddisseg_predict_onnx on a tiny exported network: on both runtimes it runs in a process where
importing PyTorch (and nnU-Net) fails and writes what the in-process predictor computes; it reports bad input, a
precision the export did not verify and bf16 on a CPU without it (simulated) in one line. Its equality with
nnUNetv2_predict on trained models is in tests/e2e/test_onnx_deploy.py."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from nnunetv2_meddisseg.deploy import runtimes
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, FORMAT_VERSION, fold_model_file
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


def _export_tiny(folder: Path, folds=(0, 1)) -> None:
    """An export folder of a (B, 3, H, W) -> (B, 2, H, W) convolutional network per fold, and its description."""
    folds_info = []
    for fold in folds:
        torch.manual_seed(fold)
        net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 2, 3, padding=1)).eval()
        buffer = io.BytesIO()
        torch.onnx.export(net, (torch.zeros(1, 3, 16, 16),), buffer, input_names=["image"], output_names=["logits"],
                          opset_version=18, dynamo=False,
                          dynamic_axes={n: {0: "b", 2: "h", 3: "w"} for n in ("image", "logits")})
        (folder / f"fold_{fold}").mkdir(parents=True)
        (folder / fold_model_file(fold)).write_bytes(buffer.getvalue())
        folds_info.append({"fold": str(fold), "file": fold_model_file(fold), "checks": []})
    description = {
        "format_version": FORMAT_VERSION, "trainer": "tiny", "plans": "nnUNetPlans", "configuration": "2d",
        "checkpoint": "checkpoint_final.pth", "folds": folds_info, "patch_size": [16, 16], "num_input_channels": 3,
        "num_segmentation_heads": 2,
        "normalization": [{"scheme": "ZScoreNormalization", "use_mask_for_norm": False,
                           "intensity_properties": {}}] * 3,
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2], "file_ending": ".png",
        "labels": {"background": 0, "polyp": 1}, "regions_class_order": None, "mirror_axes": [0, 1],
        "tile_step_size": 0.5}
    (folder / DESCRIPTION_FILE).write_text(json.dumps(description))


def _cases(folder: Path) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, shape in enumerate([(16, 16), (29, 21), (9, 12)]):
        Image.fromarray(rng.integers(0, 256, (*shape, 3)).astype(np.uint8)).save(folder / f"case{i}_0000.png")


@pytest.fixture
def exported(tmp_path) -> Path:
    _export_tiny(tmp_path / "model")
    _cases(tmp_path / "in")
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    return tmp_path


def _without_torch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
@pytest.mark.parametrize("tta", [True, False], ids=["mirroring", "no_mirroring"])
def test_runs_where_torch_cannot_be_imported(exported, tta, runtime):
    tmp = exported
    blocked = _without_torch(tmp, "-c", "import torch")
    assert blocked.returncode != 0 and "torch is blocked" in blocked.stderr  # the blocker works
    args = ["-m", "nnunetv2_meddisseg.deploy.predict_onnx", "-i", str(tmp / "in"), "-o", str(tmp / "out"),
            "-m", str(tmp / "model"), "--threads", "1", "--runtime", runtime] + ([] if tta else ["--disable_tta"])
    proc = _without_torch(tmp, *args)
    assert proc.returncode == 0, proc.stderr
    assert "3 case(s) written" in proc.stdout
    assert ("OpenVINO CPU, fp32" if runtime == "openvino" else "providers CPUExecutionProvider") in proc.stdout
    predictor = OnnxPredictor(tmp / "model", use_mirroring=tta, threads=1, runtime=runtime)
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
    model = ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model")]
    for argv, message in [
        (["--runtime", "openvino", "--providers", "CPUExecutionProvider"], "--providers: ONNX Runtime's execution "
                                                                           "providers do not apply"),
        (["--precision", "int8"], "was not verified in int8 at export (export it with nnUNetv2_meddisseg_export "
                                  "--int8)"),
        (["--precision", "int8", "--runtime", "onnxruntime"], "--precision int8 runs on --runtime openvino only"),
    ]:
        assert main(model + argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
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
    predictor = OnnxPredictor(tmp / "model", providers=[entry], runtime="onnxruntime")
    assert given == [[entry], [entry]]  # one session per fold
    assert predictor.providers_in_use == ["CPUExecutionProvider"]
    with pytest.raises(Exception, match="NoSuchProvider not available"):
        OnnxPredictor(tmp / "model", providers=[("NoSuchProvider", {}), "CPUExecutionProvider"], runtime="onnxruntime")
    assert main(["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--threads", "1",
                 "--providers", "CPUExecutionProvider"]) == 0
    assert "providers CPUExecutionProvider" in capsys.readouterr().out


def _verified_bf16(folder: Path) -> None:
    """The tiny export's description with bf16 recorded as verified for every fold (the fp32 graph, run whole)."""
    description = json.loads((folder / DESCRIPTION_FILE).read_text())
    for fold in description["folds"]:
        fold["precisions"] = {"bf16": {"verified": True, "model": fold["file"], "files": {}, "kept_in_fp32": []}}
    (folder / DESCRIPTION_FILE).write_text(json.dumps(description))


def test_bf16_is_refused_in_one_line_on_a_cpu_without_it(exported, capsys, monkeypatch):
    tmp = exported
    _verified_bf16(tmp / "model")
    argv = ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--precision", "bf16",
            "--threads", "1"]
    if runtimes.cpu_supports_bf16():  # this CPU has it: the verified bf16 runs
        assert main(argv) == 0, capsys.readouterr().err
        assert "OpenVINO CPU, bf16" in capsys.readouterr().out
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: ["WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"])
    for out in ("out", "out_no_bf16"):
        code = main(argv[:3] + [str(tmp / out)] + argv[4:])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"{PROG}: error: --precision bf16: this CPU has no native bf16 (OpenVINO's CPU "
                              f"capabilities: WINOGRAD, FP32, INT8"), err
    assert not (tmp / "out_no_bf16").exists()


def test_a_changed_reduced_precision_graph_is_refused(exported, capsys):
    tmp = exported
    description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
    for fold in description["folds"]:
        fold["precisions"] = {"int8": {"verified": True, "model": fold["file"], "files": {fold["file"]: "0" * 64},
                                       "kept_in_fp32": []},
                              "bf16": {"verified": False, "reason": "misses the bound"}}
    (tmp / "model" / DESCRIPTION_FILE).write_text(json.dumps(description))
    argv = ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model")]
    assert main(argv + ["--precision", "int8"]) == 2
    assert "fold_0/model.onnx: its sha256 is not the one the export recorded" in capsys.readouterr().err
    if runtimes.cpu_supports_bf16():
        assert main(argv + ["--precision", "bf16"]) == 2
        assert "the export did not verify fold 0 in bf16 (misses the bound)" in capsys.readouterr().err
