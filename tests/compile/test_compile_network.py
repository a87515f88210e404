"""torch.compile (inductor, CPU) of whole networks gives the eager outputs, gradients and BatchNorm
statistics, with no graph break:

- MedDisSegNet (default arguments: ResNet-50 + ELAT, TeLU, fusion "sum") at 32x32 in training mode
  with every output (MedDisSegOutput with the auxiliary maps and the dispersive features), in
  inference mode (logits only), and its encoder features in training mode (Stage I);
- nnUNetTrainerDispersive's network: nnU-Net's PlainConvUNet with the forward hook that captures
  ``encoder.stages[0]``, compiled as nnU-Net compiles it in ``initialize``, one training step against
  an eager trainer with the same run seed.

Both are marked ``slow`` (run them with ``-m slow``): inductor generates and compiles C++ kernels for
every graph (MedDisSegNet: three graphs of about 200-1000 operators each, forward and backward).
Tolerance: with BatchNorm in training mode at 32x32 and batch 2 (layer3 normalises 8 values per
channel) the eager fp32 gradients of the first layers differ from float64 ones by up to percent, and
inductor's reordered fp32 arithmetic differs from eager fp32 by as much. So the compiled network
is compared with float64 eager: its relative error (norm) must stay within 3x that of eager fp32
(MedDisSegNet); the small PlainConvUNet step is compared with eager fp32 directly (rtol 1e-4).
"""
from copy import deepcopy

import pytest
import torch
from compile_check import compare_compiled_to_float64, graph_breaks

from nnunetv2_meddisseg.architectures import MedDisSegNet, MedDisSegOutput
from nnunetv2_meddisseg.training.nnUNetTrainerDispersive import nnUNetTrainerDispersive
from tests.training.test_trainer_meddisseg import DATASET, DATASET_JSON, PLAIN_UNET, tiny_plans

FACTOR = 3.0


class _Output(torch.nn.Module):
    """MedDisSegNet called for one output (as the trainer calls its compiled network), as a module."""

    def __init__(self, net: MedDisSegNet, output: str) -> None:
        super().__init__()
        self.net, self.output = net, output

    def forward(self, x):
        return self.net(x, output=self.output)


#: mode -> (the network's output, training mode)
MODES = {"training": ("all", True), "inference": ("logits", False), "encoder": ("encoder", True)}


def _network(mode: str) -> _Output:
    torch.manual_seed(0)
    output, training = MODES[mode]
    return _Output(MedDisSegNet(3, 3), output).train(training)


@pytest.mark.slow
@pytest.mark.parametrize("mode", sorted(MODES))
def test_compiled_meddisseg_matches_eager(mode):
    net = _network(mode)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    breaks, reasons = graph_breaks(net, x)
    assert breaks == 0, reasons
    if mode == "training":
        out = net(x)
        assert isinstance(out, MedDisSegOutput) and out.fg is not None and out.uc is not None
    counts = compare_compiled_to_float64(net, [x.requires_grad_(mode != "inference")], factor=FACTOR)
    assert counts["graphs"] == 1
    # training: logits, 3 path logits, fg, bg, uc, 3 features; encoder-only: 4 features
    assert counts["outputs"] == {"training": 10, "inference": 1, "encoder": 4}[mode]


# ---------------------------------------------------------------------------------------- nnUNetTrainerDispersive
def _plans() -> dict:
    plans = tiny_plans(PLAIN_UNET)
    plans["continue_training"] = False
    return plans


@pytest.fixture
def nnunet_folders(tmp_path, monkeypatch):
    preprocessed = tmp_path / "preprocessed" / DATASET / "nnUNetPlans_2d"
    preprocessed.mkdir(parents=True)
    (preprocessed / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read
    monkeypatch.setenv("nnUNet_preprocessed", str(tmp_path / "preprocessed"))
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "results"))
    monkeypatch.setenv("nnUNet_meddisseg_seed", "0")
    return tmp_path


def _dispersive_trainer(compiled: bool, monkeypatch) -> nnUNetTrainerDispersive:
    # nnU-Net never compiles on CPU; with compilation on, initialize compiles the network (and the Dice
    # term of the loss) before the hook is registered behind the torch.compile wrapper
    monkeypatch.setattr(nnUNetTrainerDispersive, "_do_i_compile", lambda self: compiled)
    trainer = nnUNetTrainerDispersive(plans=_plans(), configuration="2d", fold=0, dataset_json=deepcopy(DATASET_JSON),
                                      device=torch.device("cpu"))
    trainer.initialize()
    return trainer


def _batch(b=2, size=32):
    g = torch.Generator().manual_seed(0)
    target = torch.zeros(b, 1, size, size)
    target[:, :, 4:14, 4:14] = 1
    target[:, :, 18:28, 16:30] = 2
    # nnU-Net's default deep-supervision targets: full resolution and 1/2
    return {"data": torch.randn(b, 3, size, size, generator=g), "target": [target, target[:, :, ::2, ::2]],
            "keys": [f"case_{i:03d}" for i in range(b)]}


@pytest.mark.slow
def test_compiled_dispersive_trainer_step_matches_eager(nnunet_folders, monkeypatch):
    torch._dynamo.reset()
    eager = _dispersive_trainer(False, monkeypatch)
    compiled = _dispersive_trainer(True, monkeypatch)
    assert isinstance(compiled.network, torch._dynamo.OptimizedModule)
    plain = compiled._plain_network()
    breaks, reasons = graph_breaks(compiled.network, _batch()["data"])
    compiled._captured.clear()  # explain ran the hook once
    assert breaks == 0, reasons
    for name, p in eager.network.named_parameters():
        assert torch.equal(p, plain.get_parameter(name))  # same run seed, same initial weights

    results = []
    for trainer in (eager, compiled):
        trainer.on_epoch_start()
        trainer.on_train_epoch_start()
        results.append(trainer.train_step(_batch()))
        assert trainer._captured == []  # the hook captured exactly one output, which the step consumed
    expected, actual = results
    assert actual["loss_dispersive"] < 0
    for key in ("loss", "loss_seg", "loss_dispersive", "dispersion_mean_pairwise_distance"):
        assert float(actual[key]) == pytest.approx(float(expected[key]), rel=1e-4, abs=1e-6), key
    # one SGD step from equal weights: equal updated weights mean equal (clipped) gradients
    for name, p in eager.network.named_parameters():
        torch.testing.assert_close(plain.get_parameter(name), p, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    torch._dynamo.reset()
