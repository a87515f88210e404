"""nnUNetv2_meddisseg_predict_onnx on a tiny exported network: on both runtimes it runs in a process where
importing PyTorch, nnU-Net and onnx fails and writes what the in-process predictor computes; it reports bad input, a
precision the export did not verify and bf16 on a CPU without it (simulated) in one line, reads a reduced
precision's OpenVINO IR only through the sha256, shapes and fields its description records, and shows a large
case's tiles in a progress bar of their own. Its equality with
nnUNetv2_predict on trained models is in tests/e2e/test_onnx_deploy.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_export import export_tiny, tiny_graph, traced_graph, write_cases

from nnunetv2_meddisseg.deploy import predict_onnx, runtimes
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, fold_model_file, sha256_of
from nnunetv2_meddisseg.deploy.predict_onnx import PROG, OnnxPredictor, main
from nnunetv2_meddisseg.errors import UserError

BLOCKER = '''import sys


class _Blocked:
    """Refuses to import PyTorch, nnU-Net and onnx in this process."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "nnunetv2", "onnx"):
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
@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
@pytest.mark.parametrize("tta", [True, False], ids=["mirroring", "no_mirroring"])
def test_runs_where_torch_cannot_be_imported(exported, tta, runtime):
    tmp = exported
    for module in ("torch", "onnx"):
        blocked = _without_torch(tmp, "-c", f"import {module}")
        assert blocked.returncode != 0 and f"{module} is blocked" in blocked.stderr  # the blocker works
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


#: figures of a candidate as the guard records them (deploy.precision_guard.Verifier.figures)
FIGURES = {"cases": 2, "mean_dice_to_fp32": 1.0, "min_dice_to_fp32": 1.0, "pseudo_dice_fp32": 0.5,
           "pseudo_dice": 0.5, "pseudo_dice_drop_points": 0.0}
GUARD = {"bounds": {"min_dice_to_fp32": 0.99, "max_pseudo_dice_drop": 0.5}, "calibration_tiles": 4,
         "validation": "the fold's validation cases"}


def _record_precisions(folder: Path, records) -> dict:
    """The tiny export's description with ``records(fold) -> the fold's precisions`` and the guard's settings."""
    description = json.loads((folder / DESCRIPTION_FILE).read_text())
    for fold in description["folds"]:
        fold["precisions"] = records(fold)
    description["precision_guard"] = GUARD
    (folder / DESCRIPTION_FILE).write_text(json.dumps(description))
    return description


def _verified_bf16(fold: dict) -> dict:
    """bf16 recorded as verified (the fp32 graph, run whole)."""
    return {"bf16": {"verified": True, "model": fold["file"], "files": {}, "kept_in_fp32": [], "figures": FIGURES}}


def _ir_as_int8(folder: Path, graph: bytes = None, floats_in_bf16: dict = None):
    """``records(fold)``: each fold's graph (or ``graph``) written as an OpenVINO IR ``fold_<f>/model_int8.xml`` /
    ``.bin`` and recorded as its verified int8 graph. The IR is not quantized: what is tested is how the predictor
    reads it (tests/e2e/test_onnx_deploy.py runs real INT8 graphs). floats_in_bf16: the record of its second
    verification, with bf16 float operations (None: none recorded)."""
    import openvino as ov

    def records(fold: dict) -> dict:
        stem = folder / f"fold_{fold['fold']}" / "model_int8"
        model = ov.Core().read_model(graph if graph is not None else (folder / fold["file"]).read_bytes())
        ov.save_model(model, str(stem.with_suffix(".xml")), compress_to_fp16=False)
        files = {f"fold_{fold['fold']}/model_int8{e}": sha256_of(stem.with_suffix(e).read_bytes())
                 for e in (".xml", ".bin")}
        record = {"verified": True, "model": f"fold_{fold['fold']}/model_int8.xml", "files": files,
                  "kept_in_fp32": ["/0"], "figures": FIGURES}
        return {"int8": record if floats_in_bf16 is None else {**record, "floats_in_bf16": floats_in_bf16}}
    return records


def test_bf16_is_refused_in_one_line_on_a_cpu_without_it(exported, capsys, monkeypatch):
    tmp = exported
    _record_precisions(tmp / "model", _verified_bf16)
    argv = ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--precision", "bf16",
            "--threads", "1"]
    if runtimes.openvino_has_bf16():  # this CPU has it: the verified bf16 runs
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


def test_a_precision_the_export_refused_is_refused(exported, capsys, monkeypatch):
    tmp = exported
    _record_precisions(tmp / "model", lambda fold: {"bf16": {"verified": False, "reason": "misses the bound"}})
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: ["FP32", "BF16"])  # simulated: bf16 would run
    assert main(["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--precision", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the export did not verify fold 0 in bf16 (misses the bound)" in err, err
    assert not (tmp / "out").exists()


def test_an_openvino_ir_runs_as_recorded(exported, capsys):
    """A fold's IR runs where its files have the recorded sha256 and its shapes fit the description: the same
    masks as the ONNX graph it was saved from, also in two parts (one preprocessing ahead, one sequential) and
    continued; a changed weights file, a file missing and a graph with other output channels are refused in one
    line before anything is written."""
    tmp = exported
    model = tmp / "model"
    _record_precisions(model, _ir_as_int8(model))
    argv = ["-i", str(tmp / "in"), "-m", str(model), "--threads", "1", "--precision", "int8"]
    for part, more in (("0", []), ("1", ["--sequential"])):
        assert main(argv + ["-o", str(tmp / "int8"), "-num_parts", "2", "-part_id", part, *more]) == 0
    out = capsys.readouterr().out
    assert "2 case(s) written" in out and "1 case(s) written" in out and "OpenVINO CPU, int8 (floats in fp32)" in out
    assert main(argv + ["-o", str(tmp / "int8"), "--continue_prediction"]) == 0
    assert "3 case(s) already predicted, 0 to go" in capsys.readouterr().out
    assert main(argv[:-2] + ["-o", str(tmp / "fp32")]) == 0
    for i in range(3):
        assert np.array_equal(np.asarray(Image.open(tmp / "int8" / f"case{i}.png")),
                              np.asarray(Image.open(tmp / "fp32" / f"case{i}.png")))
    weights = model / "fold_1" / "model_int8.bin"
    original = weights.read_bytes()
    weights.write_bytes(original[:-4] + bytes(4))
    _refused(argv + ["-o", str(tmp / "out")], capsys, "fold_1/model_int8.bin: its sha256")
    weights.write_bytes(original)
    xml = model / "fold_0" / "model_int8.xml"
    xml.rename(xml.with_name("moved.xml"))
    _refused(argv + ["-o", str(tmp / "out")], capsys, "fold_0/model_int8.xml: missing (fold 0's int8 graph of")
    xml.with_name("moved.xml").rename(xml)
    assert main(argv + ["-o", str(tmp / "int8")]) == 0  # all back as recorded: it runs again
    _record_precisions(model, _ir_as_int8(model, tiny_graph(0, out_channels=3)))
    _refused(argv + ["-o", str(tmp / "out")], capsys,
             "fold_0/model_int8.xml: the graph's output has 3 segmentation heads, onnx_model.json says 2")
    assert not (tmp / "out").exists()


def test_an_openvino_ir_is_checked_against_the_description(exported, capsys):
    """An IR holds the description's fields of the ONNX graph it was saved from (OpenVINO keeps them): one of other
    fields, or of none, is refused naming the IR though its sha256 is recorded, and so is a description edited
    after a valid IR was recorded; nothing is written."""
    tmp = exported
    model = tmp / "model"
    argv = ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(model), "--threads", "1", "--precision", "int8"]
    description = _record_precisions(model, _ir_as_int8(model))
    _record_precisions(model, _ir_as_int8(model, tiny_graph(0, description={**description, "patch_size": [32, 32]})))
    _refused(argv, capsys, f"model/{DESCRIPTION_FILE}: patch_size [16, 16] is not what fold_0/model_int8.xml was "
                           f"exported and checked with ([32, 32]): the description was edited; export again")
    _record_precisions(model, _ir_as_int8(model, traced_graph(0)))
    _refused(argv, capsys, "model/fold_0/model_int8.xml: carries no record of the fields it was exported and "
                           "checked with")
    description = _record_precisions(model, _ir_as_int8(model))
    assert main(argv[:3] + [str(tmp / "int8")] + argv[4:]) == 0  # as exported: it runs
    description["tile_step_size"] = 0.25
    (model / DESCRIPTION_FILE).write_text(json.dumps(description))
    _refused(argv, capsys, "tile_step_size 0.25 is not what fold_0/model_int8.xml was exported and checked with (0.5)")
    assert not (tmp / "out").exists()


def test_a_large_case_shows_its_tiles(exported, capsys, monkeypatch):
    """With the progress bar on, a case of at least TILE_PROGRESS_MIN tiles (times the folds) shows a bar of its
    tiles; the tiny cases (at most 6 tiles, 2 folds) show none by default, and nothing without the progress bar."""
    tmp = exported
    predictor = OnnxPredictor(tmp / "model", threads=1)
    predictor.predict_folder(tmp / "in", tmp / "out", progress=True)
    err = capsys.readouterr().err
    assert "case" in err and "tiles x folds" not in err  # the cases' bar only
    monkeypatch.setattr(predict_onnx, "TILE_PROGRESS_MIN", 12)  # case1 (29 x 21): 3 x 2 tiles, 2 folds
    predictor.predict_folder(tmp / "in", tmp / "out2", progress=True)
    err = capsys.readouterr().err
    assert "case1 (tiles x folds)" in err and "case0 (tiles x folds)" not in err, err
    calls = []  # what the bar counts: every tile of every fold once
    predictor.logits(predictor.prepare([tmp / "in" / "case1_0000.png"])[0], lambda *call: calls.append(call))
    assert sum(tiles for tiles, _ in calls) == 12 and {total for _, total in calls} == {12}
    predictor.predict_folder(tmp / "in", tmp / "out3")
    assert "tiles x folds" not in capsys.readouterr().err
    for i in range(3):  # the same masks with the bars
        assert np.array_equal(np.asarray(Image.open(tmp / "out2" / f"case{i}.png")),
                              np.asarray(Image.open(tmp / "out3" / f"case{i}.png")))


@pytest.mark.parametrize("recorded,capabilities,floats", [
    ({"verified": True, "figures": FIGURES}, ["FP32", "BF16", "INT8"], "bf16"),
    ({"verified": True, "figures": FIGURES}, ["FP32", "INT8"], "fp32"),
    ({"verified": False, "reason": "misses the bounds"}, ["FP32", "BF16", "INT8"], "fp32"),
    (None, ["FP32", "BF16", "INT8"], "fp32"),
], ids=["verified_and_cpu_has_bf16", "cpu_without_bf16", "not_verified", "not_recorded"])
def test_int8_float_operations_run_in_bf16_only_where_verified_and_the_cpu_has_it(exported, monkeypatch, recorded,
                                                                                   capabilities, floats):
    model = exported / "model"
    _record_precisions(model, _ir_as_int8(model, floats_in_bf16=recorded))
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: capabilities)  # simulated
    predictor = OnnxPredictor(model, threads=1, runtime="openvino", precision="int8")
    assert predictor.precision_in_use == f"int8 (floats in {floats})"
    assert [(s.floats, s.inference_precision) for s in predictor.sessions] == [
        (floats, "bf16" if floats == "bf16" else "f32")] * len(predictor.sessions)
    # asked for explicitly: fp32 always; bf16 only where the export verified it, in one line otherwise
    assert OnnxPredictor(model, threads=1, runtime="openvino", precision="int8",
                         int8_floats="fp32").precision_in_use == "int8 (floats in fp32)"
    if recorded is None or not recorded["verified"]:
        with pytest.raises(UserError, match="int8 with bf16 float operations: the export did not verify fold 0 so"):
            OnnxPredictor(model, threads=1, runtime="openvino", precision="int8", int8_floats="bf16")
    elif "BF16" not in capabilities:
        with pytest.raises(UserError, match="^int8 with bf16 float operations: this CPU has no native bf16"):
            OnnxPredictor(model, threads=1, runtime="openvino", precision="int8", int8_floats="bf16")


def test_a_session_checks_its_float_precision():
    graph = tiny_graph(0)
    with pytest.raises(ValueError, match="floats 'bf16': an int8 graph's float operations"):
        runtimes.OpenVinoSession(runtimes.read_openvino_model(graph), "fp32", 1, floats="bf16")
    with pytest.raises(ValueError, match="floats 'fp16'"):
        runtimes.OpenVinoSession(runtimes.read_openvino_model(graph), "int8", 1, floats="fp16")
    session = runtimes.OpenVinoSession(runtimes.read_openvino_model(graph), "int8", 1)
    assert (session.floats, session.inference_precision) == ("fp32", "f32")


def _refused(argv, capsys, message: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: ") and message in err, err
