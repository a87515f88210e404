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


def test_the_benchmark_writes_both_policies_as_found_and_loaded(tmp_path, monkeypatch):
    measured = []

    def seconds(policy, size, batch, steps, threads):
        measured.append(policy)
        return [2.0, 1.0, 3.0] if policy is None else [0.5, 0.5, 0.5]

    monkeypatch.setattr(shared_cpu, "step_seconds", seconds)
    assert shared_cpu.main(["--load", "1", "--out", str(tmp_path)]) == 0
    assert measured == [None, "PASSIVE", None, "PASSIVE"]
    results = json.loads((tmp_path / "shared_cpu.json").read_text())
    assert results["seconds_per_step"] == {"as found": {"default": 2.0, "PASSIVE": 0.5},
                                           "loaded": {"default": 2.0, "PASSIVE": 0.5}}  # the medians
    assert "| loaded | 2.00 | 0.50 | 4.0x |" in (tmp_path / "shared_cpu.md").read_text()


@pytest.mark.e2e  # a fresh process builds and trains the whole network
def test_a_fresh_process_times_real_training_steps():
    # one thread: no parallel region waits, so the measurement stays short on any machine
    seconds = shared_cpu.step_seconds("PASSIVE", 32, 2, 2, 1)
    assert len(seconds) == 2 and all(0 < s < 120 for s in seconds)
