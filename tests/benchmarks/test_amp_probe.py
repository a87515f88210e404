"""benchmarks/amp_probe.py: the emulated GradScaler rule, the per-module monitor's overflow finding,
and a two-step run on a generated Kvasir-like folder (real fp16 autocast and its emulation)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import amp_probe  # noqa: E402


def test_range_scaler_follows_gradscaler_rule():
    s = amp_probe.RangeScaler(init_scale=1024.0, growth_interval=3)
    s.update(overflow=True)
    assert s.scale == 512.0
    s.update(False)
    s.update(False)
    assert s.scale == 512.0
    s.update(False)  # third good step in a row: doubled
    assert s.scale == 1024.0
    s.update(False)
    s.update(True)  # an overflow resets the count of good steps
    s.update(False)
    s.update(False)
    assert s.scale == 512.0


class _Amplifier(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)
        with torch.no_grad():
            self.second.weight.copy_(torch.eye(4) * factor)
            self.second.bias.zero_()

    def forward(self, x):
        return self.second(self.first(x))


def test_monitor_names_the_module_that_leaves_fp16_range():
    torch.manual_seed(0)
    net = _Amplifier(1e5)
    x = torch.ones(2, 4)
    monitor = amp_probe.ModuleMonitor(net)
    net(x).sum().backward()
    monitor.remove()
    assert monitor.order == ["first", "second"]
    assert monitor.forward_max["second"] > amp_probe.FP16_MAX > monitor.forward_max["first"]
    assert amp_probe.RangeScaler().overflowed(monitor) == "forward: second"
    # gradients: d(sum)/d(second's output) = 1, d/d(first's output) = 1e5 per entry
    assert monitor.grad_max["second"] == pytest.approx(1.0)
    assert monitor.grad_max["first"] == pytest.approx(1e5, rel=1e-6)


def test_monitor_flags_scaled_gradient_overflow_only_above_fp16_max():
    net = _Amplifier(10.0)
    x = torch.ones(2, 4)
    for scale, expected in ((1000.0, None), (10000.0, "gradient: first")):  # gradient max = 10 * scale
        net.zero_grad()
        monitor = amp_probe.ModuleMonitor(net)
        (net(x).sum() * scale).backward()
        monitor.remove()
        assert amp_probe.RangeScaler().overflowed(monitor) == expected


@pytest.fixture
def kvasir_like(tmp_path):
    """A folder with the shipped training list's first cases as small random JPEG pairs."""
    from nnunetv2_meddisseg.datasets.split_lists import load_shipped_split

    root = tmp_path / "Kvasir-SEG"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for case in load_shipped_split("kvasir_seg.json")["train"][:4]:
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "images" / f"{case}.jpg")
        mask = np.zeros((40, 48), dtype=np.uint8)
        mask[10:30, 12:36] = 255
        Image.fromarray(mask).save(root / "masks" / f"{case}.jpg")
    return root


@pytest.mark.parametrize("precision", ["fp16-range", "fp16"])
def test_two_step_run_writes_its_report(kvasir_like, tmp_path, monkeypatch, precision):
    # a small segmentation network in place of Med-DisSeg's (46 M parameters): the loop is under test
    monkeypatch.setattr(amp_probe, "build_network", lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 2, 1)))
    out = tmp_path / "out"
    rc = amp_probe.main(["--kvasir", str(kvasir_like), "--size", "16", "--batch", "2", "--steps", "2",
                         "--max-cases", "4", "--precision", precision, "--stats-every", "1", "--diagnoses", "1",
                         "--out", str(out), "--name", "probe"])
    assert rc == 0
    payload = json.loads((out / "probe.json").read_text())
    assert [s["step"] for s in payload["steps"]] == [0, 1]
    assert payload["steps"][0]["scale"] == 2.0 ** 16
    for s in payload["steps"]:
        # a step is skipped exactly when it overflowed; the next step's scale says so
        assert s["taken"] == (s["grad_norm"] < float("inf") and "overflow" not in s)
    if not payload["steps"][0]["taken"]:
        assert payload["steps"][1]["scale"] == 2.0 ** 15
    assert len(payload["stats"]) == 2 and payload["stats"][0]["largest_forward"]
    assert "Skipped steps" in (out / "probe.md").read_text()


def test_missing_data_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="Kvasir-SEG not found"):
        amp_probe.main(["--kvasir", str(tmp_path / "nowhere"), "--steps", "1"])
