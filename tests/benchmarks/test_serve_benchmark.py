"""``benchmarks/serve.py`` on a tiny export (two folds, mirroring) and its cases: every field per network, no failed
request, every answered mask equal to the folder command's, and the targets' verdict in the exit status."""
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))

import serve as serve_benchmark  # noqa: E402
from tiny_export import export_tiny, write_cases  # noqa: E402

pytest.importorskip("litserve")
FIELDS = {"images_per_s", "vs_folder_command", "vs_command_per_image", "p50_ms", "p99_ms", "failed_requests",
          "clients", "requests"}


@pytest.mark.e2e
def test_serve_benchmark_on_a_tiny_export(tmp_path):
    export_tiny(tmp_path / "model")
    write_cases(tmp_path / "images", ("a", "b", "c"))
    code = serve_benchmark.main(["--model", f"tiny={tmp_path / 'model'}", "--images", str(tmp_path / "images"),
                                 "--per-image", "2", "--clients", "2", "--requests", "3", "--threads", "1",
                                 "--out", str(tmp_path / "results")])
    payload = json.loads((tmp_path / "results" / "serve.json").read_text())
    result = payload["results"]["tiny"]
    assert FIELDS <= set(result)
    assert result["clients"] == 2 and result["requests"] == 6 and result["failed_requests"] == 0
    assert result["failed_by_status"] == {}
    assert result["masks_identical_to_folder_command"] == 6
    assert result["images_per_s"] > 0 and result["p50_ms"] <= result["p99_ms"]
    missed = (result["vs_folder_command"] < serve_benchmark.TARGET_VS_FOLDER
              or result["vs_command_per_image"] < serve_benchmark.TARGET_VS_PER_IMAGE)
    assert code == (1 if missed else 0)
    assert payload["machine"]["cpu"] and "| tiny |" in (tmp_path / "results" / "serve.md").read_text()
