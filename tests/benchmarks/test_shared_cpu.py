"""benchmarks/shared_cpu.py: both wait policies measured in fresh processes, alone and side by side."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import shared_cpu  # noqa: E402


def test_each_policy_runs_in_its_own_processes_with_that_policy(monkeypatch):
    seen = []

    class Process:
        def __init__(self, command, env, **kwargs):
            seen.append(env.get("OMP_WAIT_POLICY"))
            self.returncode = 0

        def communicate(self):
            return "[0.5, 0.25]\n", ""

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # this process's own policy does not reach the measurement
    monkeypatch.setattr(shared_cpu.subprocess, "Popen", Process)
    assert shared_cpu.step_seconds(None, 32, 4, 2, 2) == [0.5, 0.25]
    assert shared_cpu.step_seconds("PASSIVE", 32, 4, 2, 2, copies=2) == [0.5, 0.25, 0.5, 0.25]
    assert seen == [None, "PASSIVE", "PASSIVE"]


def test_the_benchmark_writes_both_policies_alone_and_side_by_side(tmp_path, monkeypatch):
    measured = []

    def seconds(policy, size, batch, steps, threads, copies=1):
        measured.append((policy, copies))
        return [2.0, 1.0, 3.0] if policy is None else [0.5, 0.5, 0.5]

    monkeypatch.setattr(shared_cpu, "step_seconds", seconds)
    assert shared_cpu.main(["--rounds", "2", "--copies", "3", "--out", str(tmp_path)]) == 0
    assert measured == [(None, 1), ("PASSIVE", 1)] * 2 + [(None, 3), ("PASSIVE", 3)] * 2  # alternating
    results = json.loads((tmp_path / "shared_cpu.json").read_text())
    assert results["seconds_per_step"] == {"alone": {"default": [2.0, 2.0], "PASSIVE": [0.5, 0.5]},
                                           "side by side": {"default": [2.0, 2.0], "PASSIVE": [0.5, 0.5]}}
    assert "| side by side | 2.00 (2.00-2.00) | 0.50 (0.50-0.50) | 4.0x |" in (tmp_path / "shared_cpu.md").read_text()


@pytest.mark.e2e  # fresh processes build and train the whole network
def test_fresh_processes_time_real_training_steps():
    # one thread: no parallel region waits, so the measurement stays short on any machine
    seconds = shared_cpu.step_seconds("PASSIVE", 32, 2, 2, 1, copies=2)
    assert len(seconds) == 4 and all(0 < s < 120 for s in seconds)
