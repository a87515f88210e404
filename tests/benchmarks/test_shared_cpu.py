"""benchmarks/shared_cpu.py: both wait policies measured in fresh processes, with and without added load."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import shared_cpu  # noqa: E402


def test_each_policy_runs_in_its_own_process_with_that_policy(monkeypatch):
    seen = []

    def run(command, env, **kwargs):
        seen.append(env.get("OMP_WAIT_POLICY"))
        return shared_cpu.subprocess.CompletedProcess(command, 0, stdout="[0.5, 0.25, 1.0]\n")

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # this process's own policy does not reach the measurement
    monkeypatch.setattr(shared_cpu.subprocess, "run", run)
    assert shared_cpu.step_seconds(None, 32, 4, 3, 2) == [0.5, 0.25, 1.0]
    assert shared_cpu.step_seconds("PASSIVE", 32, 4, 3, 2) == [0.5, 0.25, 1.0]
    assert seen == [None, "PASSIVE"]


@pytest.mark.e2e  # starts four processes that each build and train the whole network
def test_the_benchmark_writes_both_policies_as_found_and_loaded(tmp_path):
    # one thread: no parallel region waits, so the measurement stays short on any machine
    assert shared_cpu.main(["--size", "32", "--steps", "1", "--threads", "1", "--load", "1",
                            "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "shared_cpu.json").read_text())
    assert set(results["seconds_per_step"]) == {"as found", "loaded"}
    for by_policy in results["seconds_per_step"].values():
        assert set(by_policy) == {"default", "PASSIVE"} and all(0 < s < 120 for s in by_policy.values())
    assert "| loaded |" in (tmp_path / "shared_cpu.md").read_text()
