"""Every ablation variant of nnUNetTrainerMedDisSeg in-process: its recipe reaches the loss, and one training
step runs in each stage it trains on a tiny batch (32x32, batch 2). (The network ablations are plans:
tests/planning.)"""
from copy import deepcopy

import pytest
import torch
from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
from test_trainer_meddisseg import make_batch, make_trainer, tiny_plans
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU
from nnunetv2_meddisseg.blocks.attention import CBAT, ELAT
from nnunetv2_meddisseg.losses import dispersive_loss
from nnunetv2_meddisseg.training import variants as av
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2

pytestmark = pytest.mark.e2e  # trains the whole network through a trainer (the quick loop leaves it out)

#: the paper's settings, which every variant keeps except where it says otherwise
FULL = {"lambda1": 0.2, "lambda2": 0.6, "variant": "infonce_l2", "tau": 0.8, "placement": "early",
        "elat": True, "activation": "telu", "cbat": True, "stage1": True}
#: variant -> what it changes (written out here, independently of the classes' attributes)
CHANGES = {
    av.nnUNetTrainerMedDisSeg_noDispersive: {"lambda1": 0.0, "lambda2": 0.0},
    av.nnUNetTrainerMedDisSeg_dispersiveStage1Only: {"lambda2": 0.0},
    av.nnUNetTrainerMedDisSeg_dispersiveStage2Only: {"lambda1": 0.0},
    av.nnUNetTrainerMedDisSeg_cosine: {"variant": "infonce_cosine"},
    av.nnUNetTrainerMedDisSeg_hinge: {"variant": "hinge"},
    av.nnUNetTrainerMedDisSeg_covariance: {"variant": "covariance"},
    av.nnUNetTrainerMedDisSeg_middle: {"placement": "middle"},
    av.nnUNetTrainerMedDisSeg_late: {"placement": "late"},
    av.nnUNetTrainerMedDisSeg_allLayers: {"placement": "all"},
    av.nnUNetTrainerMedDisSeg_tau0p1: {"tau": 0.1},
    av.nnUNetTrainerMedDisSeg_tau0p5: {"tau": 0.5},
    av.nnUNetTrainerMedDisSeg_tau1p0: {"tau": 1.0},
    av.nnUNetTrainerMedDisSeg_lambda0p2: {"lambda2": 0.2},
    av.nnUNetTrainerMedDisSeg_lambda1p0: {"lambda2": 1.0},
    av.nnUNetTrainerMedDisSeg_noStage1: {"stage1": False},
}


def network_options(network: nn.Module) -> dict:
    """What the network's modules show of the elat / activation / cbat options."""
    after_encoder = [m for name, m in network.named_modules() if not name.startswith("encoder")]
    telu = any(isinstance(m, TeLU) for m in after_encoder)
    relu = any(isinstance(m, nn.ReLU) for m in after_encoder)
    assert telu != relu, "exactly one activation is expected outside the ResNet-50"
    return {"elat": all(isinstance(m, ELAT) for m in network.elat),
            "activation": "telu" if telu else "relu",
            "cbat": all(isinstance(p.cbat, CBAT) for p in (network.decoder.small, network.decoder.medium,
                                                          network.decoder.large))}


def expected_dispersive(network: nn.Module, data: torch.Tensor, placement: str, variant: str, tau: float) -> float:
    """The Stage II dispersive term computed from the network's features with the pure loss function."""
    with torch.no_grad():
        features = network(data, output="all").features
    names = ("early", "middle", "late") if placement == "all" else (placement,)
    return float(torch.stack([dispersive_loss(features[n], variant, tau) for n in names]).mean())


@pytest.fixture(scope="module")
def default_network():
    """One MedDisSegNet with the default options, copied into the variants that do not change the network
    (building a ResNet-50 is most of a variant's test time)."""
    plans_manager = PlansManager(tiny_plans())
    torch.manual_seed(0)
    return nnUNetTrainerMedDisSeg.build_network_architecture(plans_manager, plans_manager.get_configuration("2d"),
                                                             3, 3, enable_deep_supervision=True)


@pytest.mark.parametrize("cls", list(CHANGES), ids=lambda c: c.__name__.split("_", 1)[1])
def test_variant_reaches_network_and_loss_and_trains_one_step(cls, nnunet_dirs, default_network, monkeypatch):
    want = {**FULL, **CHANGES[cls]}
    assert cls.build_network_architecture is nnUNetTrainerMedDisSeg.build_network_architecture

    def build(plans_manager, configuration_manager, num_input_channels, num_output_channels,
              enable_deep_supervision=True):
        return deepcopy(default_network)

    monkeypatch.setattr(cls, "build_network_architecture", staticmethod(build))
    torch.manual_seed(0)
    trainer = make_trainer(cls)
    assert network_options(trainer.network) == {k: want[k] for k in ("elat", "activation", "cbat")}
    assert (trainer.dispersive.variant, trainer.dispersive.tau, trainer.dispersive.placement) == \
        (want["variant"], want["tau"], want["placement"])
    assert trainer.stage1_epochs == (250 if want["stage1"] else 0)
    batch = make_batch()

    if want["stage1"] and want["lambda1"] != FULL["lambda1"]:  # a Stage I step where the variant changes Stage I
        trainer.current_epoch = 0
        trainer.on_train_epoch_start()
        assert trainer.training_stage == STAGE_1
        out = trainer.train_step(batch)
        expected = (out["loss_seg"] + out["loss_seg_perturbed"] + out["loss_consistency"]
                    + want["lambda1"] * out["loss_dispersive"])
        assert float(out["loss"]) == pytest.approx(expected, rel=1e-5, abs=1e-6)

    trainer.current_epoch = trainer.stage1_epochs
    trainer.on_train_epoch_start()
    assert trainer.training_stage == STAGE_2 and trainer.stage1_head is None
    dispersive = expected_dispersive(trainer.network, batch["data"], want["placement"], want["variant"], want["tau"])
    out = trainer.train_step(batch)
    assert out["loss_dispersive"] == pytest.approx(dispersive, rel=1e-4, abs=1e-6)
    expected = (out["loss_seg"] + 0.5 * out["loss_seg_paths"] + out["loss_fg_bg"] + out["loss_complementarity"]
                + want["lambda2"] * out["loss_dispersive"])
    assert float(out["loss"]) == pytest.approx(expected, rel=1e-5, abs=1e-6)
