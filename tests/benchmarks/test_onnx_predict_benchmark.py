"""``benchmarks/onnx_predict.py`` and the GPU script's ``onnx`` step on the CPU: which ONNX Runtime providers
become arms, a run where none is available, the step's table, and the whole step at 32x32 (CPU provider)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_report  # noqa: E402
import onnx_predict  # noqa: E402

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


def test_each_provider_is_an_arm_falling_back_through_the_ones_after_it():
    arms, left_out = onnx_predict.provider_arms([TRT, CUDA, CPU], [TRT, CUDA, CPU])
    assert arms == {"Tensorrt": [TRT, CUDA, CPU], "CUDA": [CUDA, CPU], "CPU": [CPU]} and left_out == {}
    arms, left_out = onnx_predict.provider_arms([TRT, CUDA], ["AzureExecutionProvider", CPU])
    assert arms == {}
    assert set(left_out) == {TRT, CUDA}
    assert left_out[CUDA] == f"not in this onnxruntime (available: AzureExecutionProvider, {CPU})"
    arms, _ = onnx_predict.provider_arms([TRT], [TRT, CPU])  # no CUDA provider to fall back to
    assert arms == {"Tensorrt": [TRT, CPU]}
    # TensorRT's sessions cache their engines; the other providers pass as names
    entries = onnx_predict._session_providers([TRT, CUDA, CPU], Path("cache"))
    assert entries[0] == (TRT, {"trt_engine_cache_enable": True, "trt_engine_cache_path": "cache"})
    assert entries[1:] == [CUDA, CPU]


def test_no_available_provider_times_nothing_and_says_why(tmp_path, capsys):
    assert onnx_predict.main(["--providers", "NoSuchExecutionProvider", "--no-forms", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "onnx_predict.json").read_text())
    assert payload["run"]["results"] == {} and payload["run"]["arms"] == {}
    assert "NoSuchExecutionProvider" in payload["run"]["providers_left_out"]
    text = (tmp_path / "onnx_predict.md").read_text()
    assert "Nothing timed" in text and "Left out: NoSuchExecutionProvider not in this onnxruntime" in text


def test_the_steps_table_pairs_each_provider_with_nnunets_predictor():
    agreement = {"min_dice": 0.9991, "sessions_and_first_round_s": 42.0, "identical_masks": 9, "cases": 10,
                 "max_probability_difference": 1e-3, "providers_in_use": [CUDA, CPU]}
    onnx = {"onnxruntime": "1.2.3", "providers_available": [CUDA, CPU], "cases": 10,
            "providers_left_out": {TRT: "not in this onnxruntime (available: ...)"},
            "results": {"Med-DisSeg / nnUNetv2_predict / TTA on": {"images_per_s": 100.0},
                        "Med-DisSeg / CUDA / TTA on": {"images_per_s": 150.0},
                        "Med-DisSeg / CUDA / TTA on / agreement": agreement}}
    onnx["results"]["Med-DisSeg / Tensorrt / TTA on / agreement"] = {"error": "RuntimeError: no libnvinfer"}
    lines = gpu_report.onnx_markdown(onnx)
    rows = [line for line in "\n".join(lines).splitlines() if line.startswith("| Med-DisSeg")]
    assert rows == ["| Med-DisSeg | TTA on | CUDA | 100.0 | 150.0 | 1.50x | 42.0 | 0.9991 |"]
    assert f"Left out: {TRT} not in this onnxruntime (available: ...)" in lines
    assert "Med-DisSeg / Tensorrt / TTA on: RuntimeError: no libnvinfer" in lines
    assert gpu_report.onnx_markdown(None) == []


def test_an_arm_that_cannot_start_is_recorded_not_fatal(tmp_path, monkeypatch):
    """ONNX Runtime can list a provider whose libraries are missing: that arm's error is its record, and the run
    goes on with the other arms."""
    from nnunetv2_meddisseg.deploy import predict_onnx

    def refuse(self, *args, **kwargs):
        raise RuntimeError("TensorRT EP could not be created:\n libnvinfer.so.10 missing")

    monkeypatch.setattr(predict_onnx.OnnxPredictor, "__init__", refuse)
    predictor, record = onnx_predict.start_arm(tmp_path, [TRT], True, 1, tmp_path, tmp_path / "out", tmp_path, [],
                                               ".png")
    assert predictor is None
    assert record == {"error": "RuntimeError: TensorRT EP could not be created: libnvinfer.so.10 missing"}


def test_openvino_arms_leave_out_bf16_ones_on_a_cpu_without_it(monkeypatch):
    from nnunetv2_meddisseg.deploy import runtimes

    requested = ["fp32", "bf16", "int8", "int8+bf16"]
    monkeypatch.setattr(runtimes, "installed_runtimes", lambda: ["openvino", "onnxruntime"])
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: ["FP32", "INT8"])  # simulated
    assert onnx_predict.openvino_arms(requested) == (["fp32", "int8"], {
        "OpenVINO bf16": "this CPU has no native bf16", "OpenVINO int8+bf16": "this CPU has no native bf16"})
    monkeypatch.setattr(runtimes, "_cpu_capabilities", lambda: ["FP32", "BF16", "INT8"])
    assert onnx_predict.openvino_arms(requested) == (requested, {})
    monkeypatch.setattr(runtimes, "installed_runtimes", lambda: ["onnxruntime"])
    assert onnx_predict.openvino_arms(["int8+bf16"]) == ([], {"OpenVINO int8+bf16": "openvino is not installed"})


def test_the_arms_list_and_the_targets():
    """Each timed arm becomes one record; the target takes the fastest arm with mirroring whose test mDSC drops by
    at most 0.5 points (a faster arm that drops more does not count)."""
    figures = {"images_per_s": 1.0, "test_mdsc": 0.8, "dice_to_fp32": 1.0}
    results = {"Med-DisSeg / nnUNetv2_predict / TTA on": figures,
               "Med-DisSeg / OpenVINO int8 / TTA on": {"images_per_s": 3.5, "test_mdsc": 0.796, "dice_to_fp32": 0.99},
               "Med-DisSeg / OpenVINO int8 / TTA on / agreement": {"min_dice": 0.9},
               "Med-DisSeg / OpenVINO bf16 / TTA on": {"images_per_s": 5.0, "test_mdsc": 0.79, "dice_to_fp32": 0.98},
               "Med-DisSeg / nnUNetv2_predict / TTA off": {**figures, "images_per_s": 4.0},
               "Med-DisSeg / OpenVINO int8 / TTA off": {"images_per_s": 16.0, "test_mdsc": 0.8, "dice_to_fp32": 1.0},
               "nnU-Net default / nnUNetv2_predict / TTA on": figures,
               "nnU-Net default / CPU / TTA on": {**figures, "images_per_s": 2.0}}
    arms = onnx_predict.arms_list({"results": results})
    assert len(arms) == 7
    int8 = next(a for a in arms if a["precision"] == "int8" and a["tta"])
    assert int8 == {"network": "MedDisSeg", "runtime": "openvino", "precision": "int8", "tta": True,
                    "images_per_s": 3.5, "speedup_vs_nnunet_predictor": 3.5, "dice_to_fp32": 0.99,
                    "test_mdsc": 0.796, "mdsc_drop_points": 0.4}
    assert next(a for a in arms if a["precision"] == "bf16")["mdsc_drop_points"] == 1.0
    targets = onnx_predict.targets(arms)
    assert targets["MedDisSeg"] == {"target_speedup": 3.0, "arm": "openvino int8", "speedup": 3.5, "met": True}
    assert targets["nnUNet"] == {"target_speedup": 4.0, "arm": "onnxruntime CPU fp32", "speedup": 2.0, "met": False}


@pytest.mark.e2e
def test_the_onnx_step_on_the_cpu(tmp_path):
    """``gpu.py --steps onnx --device cpu`` at 32x32: both models exported and timed against nnU-Net's predictor
    with and without mirroring, their masks equal, the figures in both results files."""
    out = tmp_path / "out"
    command = [sys.executable, str(BENCHMARKS / "gpu.py"), "--session", str(out), "--device", "cpu", "--steps",
               "onnx", "--size", "32", "--cases", "4", "1", "2", "--repeats", "1", "--cap-scale", "3", "--work",
               str(tmp_path / "work")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(next(out.glob("gpu_cpu_*.json")).read_text())
    assert figures["steps"]["onnx"]["rc"] == 0
    onnx = figures["onnx"]
    assert onnx["arms"] == {"CPU": [CPU]} and onnx["cases"] == 2
    for model in ("Med-DisSeg", "nnU-Net default"):
        for mode in ("TTA on", "TTA off"):
            assert onnx["results"][f"{model} / nnUNetv2_predict / {mode}"]["images_per_s"] > 0
            assert onnx["results"][f"{model} / CPU / {mode}"]["images_per_s"] > 0
            agreement = onnx["results"][f"{model} / CPU / {mode} / agreement"]
            # untrained networks: their logits nearly tie, so one pixel of a 32x32 mask may flip (Dice ~0.998);
            # tests/e2e/test_onnx_deploy.py lets masks differ only at near-ties, and the masks of models trained
            # on Kvasir-SEG equal nnU-Net's in benchmarks/results/cpu_predict.json
            assert agreement["min_dice"] >= 0.99 and agreement["providers_in_use"] == [CPU]
    assert figures["targets"]["completed_through_predict"]["met"] is None  # step main did not run
    assert "| Med-DisSeg | TTA on | CPU |" in next(out.glob("gpu_cpu_*.md")).read_text()
    assert "| MedDisSeg | on | onnxruntime CPU | fp32 |" in (out / "onnx_predict.md").read_text()
