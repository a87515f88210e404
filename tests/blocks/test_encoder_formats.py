"""The ResNet-50 files people have, as the encoder loader reads them: timm's names, MoCo v2 / v3, DINO and BYOL
checkpoints (prefixed keys, nested dicts, second copies of the encoder), each written here from one randomly
initialised torchvision ResNet-50; the loaded encoder holds exactly the written tensors. A file that does not fit
is one line naming the first mismatching key as the file spells it."""
from __future__ import annotations

import pytest
import torch
import torchvision

from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights


def _random_resnet(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(weights=None)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # default statistics would hide a mix-up
                m.weight.uniform_(0.5, 1.5)
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def resnets():
    """The encoder to load and a second one (a momentum / target / student copy)."""
    return _random_resnet(0), _random_resnet(1)


def _prefixed(state: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in state.items()}


def _mlp_head(prefix: str) -> dict:
    return {f"{prefix}fc.0.weight": torch.randn(16, 2048), f"{prefix}fc.2.weight": torch.randn(8, 16)}


def torchvision_plain(main, other):
    return main.state_dict()


def timm_resnet50(main, other):
    """timm's resnet50 under timm's own names (torchvision's), nested as timm's train script saves it."""
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=10)
    model.load_state_dict({k: v for k, v in main.state_dict().items() if not k.startswith("fc.")}, strict=False)
    assert set(model.state_dict()) - {"fc.weight", "fc.bias"} == set(main.state_dict()) - {"fc.weight", "fc.bias"}
    return {"epoch": 3, "arch": "resnet50", "state_dict": model.state_dict(),
            "state_dict_ema": other.state_dict()}


def moco_v2(main, other):
    encoder_q = {k: v for k, v in main.state_dict().items() if not k.startswith("fc.")}
    state = {**_prefixed(encoder_q, "module.encoder_q."), **_mlp_head("module.encoder_q."),
             **_prefixed(other.state_dict(), "module.encoder_k."),
             "module.queue": torch.randn(128, 64), "module.queue_ptr": torch.zeros(1, dtype=torch.long)}
    return {"epoch": 200, "arch": "resnet50", "state_dict": state, "optimizer": {"state": {}, "param_groups": []}}


def moco_v3(main, other):
    state = {**_prefixed(main.state_dict(), "module.base_encoder."),
             **_prefixed(other.state_dict(), "module.momentum_encoder."),
             "module.predictor.0.weight": torch.randn(16, 256)}
    return {"epoch": 100, "arch": "resnet50", "state_dict": state, "scaler": {"scale": 1024.0}}


def base_encoder_unwrapped(main, other):
    return {**_prefixed(main.state_dict(), "base_encoder."), **_prefixed(other.state_dict(), "momentum_encoder.")}


def dino_backbone(main, other):
    return {"model": _prefixed(main.state_dict(), "backbone.")}


def dino_full(main, other):
    """DINO's checkpoint: the teacher (what DINO evaluates) and the DDP-wrapped student, each with its head."""
    head = {"head.mlp.0.weight": torch.randn(16, 2048)}
    return {"teacher": {**_prefixed(main.state_dict(), "backbone."), **head},
            "student": {**_prefixed(other.state_dict(), "module.backbone."), **_prefixed(head, "module.")},
            "epoch": 100}


def byol_solo_learn(main, other):
    return {"state_dict": {**_prefixed(main.state_dict(), "backbone."),
                           **_prefixed(other.state_dict(), "momentum_backbone."),
                           "projector.0.weight": torch.randn(16, 2048)}}


def byol_sequential(main, other):
    """BYOL's online network as ``nn.Sequential(*list(resnet.children())[:-1])`` (keys ``encoder.0.weight``, ...)."""
    online = torch.nn.Sequential(*list(main.children())[:-1]).state_dict()
    target = torch.nn.Sequential(*list(other.children())[:-1]).state_dict()
    return {"online_network_state_dict": {**_prefixed(online, "encoder."), "projetion.net.0.weight": torch.ones(2)},
            "target_network_state_dict": _prefixed(target, "encoder.")}


def pretraining_output(main, other):
    encoder = {k: v for k, v in main.state_dict().items() if not k.startswith(("fc.", "layer4."))}
    return {"network_weights": _prefixed(encoder, "encoder."), "pretraining": {"method": "models_genesis_restoration"}}


FORMATS = [torchvision_plain, timm_resnet50, moco_v2, moco_v3, base_encoder_unwrapped, dino_backbone, dino_full,
           byol_solo_learn, byol_sequential, pretraining_output]


@pytest.mark.parametrize("write", FORMATS, ids=[f.__name__ for f in FORMATS])
def test_each_format_loads_the_written_tensors(write, resnets, tmp_path):
    main, other = resnets
    torch.save(write(main, other), tmp_path / "weights.pth")
    encoder = ResNet50Encoder(3)
    load_resnet50_weights(encoder, tmp_path / "weights.pth")
    written = main.state_dict()
    for key, value in encoder.state_dict().items():
        assert torch.equal(value, written[key]), key


def _one_line_error(tmp_path, obj) -> str:
    torch.save(obj, tmp_path / "bad.pth")
    with pytest.raises(ValueError) as info:
        load_resnet50_weights(ResNet50Encoder(3), tmp_path / "bad.pth")
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "bad.pth") in message
    return message


def test_another_architecture_under_a_prefix_names_its_first_mismatching_key(tmp_path):
    resnet18 = torchvision.models.resnet18(weights=None).state_dict()
    message = _one_line_error(tmp_path, {"state_dict": _prefixed(resnet18, "module.encoder_q.")})
    assert "shape mismatch for key 'state_dict.module.encoder_q.layer1.0.conv1.weight'" in message


def test_missing_key_under_a_prefix_is_named_as_in_the_file(resnets, tmp_path):
    state = _prefixed(resnets[0].state_dict(), "backbone.")
    del state["backbone.layer3.2.bn2.running_mean"]
    message = _one_line_error(tmp_path, {"model": state})
    assert "missing key 'model.backbone.layer3.2.bn2.running_mean'" in message


def test_a_file_without_a_resnet_names_conv1(tmp_path):
    message = _one_line_error(tmp_path, {"model": {"cls_token": torch.zeros(1, 1, 8), "blocks.0.attn.qkv.weight":
                                                   torch.zeros(24, 8)}})
    assert "missing key 'conv1.weight'" in message and "'model.cls_token'" in message


def test_two_primary_encoders_are_refused(resnets, tmp_path):
    state = {**_prefixed(resnets[0].state_dict(), "a."), **_prefixed(resnets[1].state_dict(), "b.")}
    message = _one_line_error(tmp_path, state)
    assert "holds 2 ResNet encoders (under 'a.', 'b.')" in message
