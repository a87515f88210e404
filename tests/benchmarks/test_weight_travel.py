"""benchmarks/weight_travel.py: normalisation travel per top-level module, on hand-made state dicts."""
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import weight_travel  # noqa: E402


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
        self.decoder = nn.Sequential()
        self.decoder.add_module("conv", nn.Conv2d(4, 2, 1))
        self.decoder.add_module("norm", nn.InstanceNorm2d(2, affine=True))  # no running statistics


def test_travel_is_the_mean_distance_from_the_initial_values():
    net = _Net()
    with torch.no_grad():
        net.encoder[1].weight.copy_(torch.tensor([1.0, 1.2, 0.9, 1.0]))  # |gamma - 1| = 0, .2, .1, 0
        net.encoder[1].bias.copy_(torch.tensor([0.0, -0.4, 0.0, 0.0]))
        net.decoder.norm.weight.fill_(2.0)
    travel = weight_travel.norm_travel(net.state_dict())
    assert set(travel) == {"encoder", "decoder"}  # conv weights (4-D) and biases are not normalisation layers
    assert travel["encoder"]["layers"] == 1
    assert travel["encoder"]["gamma_travel"] == pytest.approx(0.3 / 4)
    assert travel["encoder"]["beta_travel"] == pytest.approx(0.1)
    assert travel["decoder"]["gamma_travel"] == pytest.approx(1.0)
    assert travel["decoder"]["beta_travel"] == 0.0


def test_untrained_network_has_not_travelled():
    travel = weight_travel.norm_travel(_Net().state_dict())
    assert all(t["gamma_travel"] == 0.0 and t["beta_travel"] == 0.0 for t in travel.values())


def test_folder_of_nnunet_checkpoints(tmp_path):
    fold = tmp_path / "results_seed0" / "Dataset1_X" / "T__P__2d" / "fold_0"
    fold.mkdir(parents=True)
    net = _Net()
    with torch.no_grad():
        net.encoder[1].weight.fill_(1.5)
    torch.save({"network_weights": net.state_dict()}, fold / "checkpoint_final.pth")
    out = tmp_path / "out"
    assert weight_travel.main([str(tmp_path), "--out", str(out), "--name", "wt"]) == 0
    runs = json.loads((out / "wt.json").read_text())["runs"]
    assert list(runs) == ["results_seed0/Dataset1_X/T__P__2d/fold_0"]
    assert runs["results_seed0/Dataset1_X/T__P__2d/fold_0"]["encoder"]["gamma_travel"] == pytest.approx(0.5)


def test_nothing_found_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint_final.pth"):
        weight_travel.main([str(tmp_path)])


def test_a_checkpoint_carrying_code_is_refused_and_never_run(tmp_path):
    from payload import Payload

    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile

    fold = tmp_path / "T__P__2d" / "fold_0"
    fold.mkdir(parents=True)
    torch.save({"network_weights": _Net().state_dict(), "logging": Payload(tmp_path / "payload_ran")},
               fold / "checkpoint_final.pth")
    with pytest.raises(UnsafeTorchFile, match="it was not loaded, since loading such objects can run code"):
        weight_travel.main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "payload_ran").exists()
