import pytest
import torch
import torchvision
from torch import nn

from nnunetv2_meddisseg.architectures import MedDisSegNet, MedDisSegOutput

REFERENCE_PARAMETERS = 45_559_635  # released Med-DisSeg Stage II, 3 input channels, 256x256


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return MedDisSegNet(3, 3)


def test_parameter_count_matches_reference():
    n = _count(MedDisSegNet(3, 2))
    assert abs(n / REFERENCE_PARAMETERS - 1) <= 0.03, n


def test_cdfa_pointwise_layers_keep_linear_initialisation():
    # value / proj are Linear layers over the channel axis stored as 1x1 convolutions: nn.Linear's uniform
    # initialisation within 1 / sqrt(128), not the He initialisation of the other convolutions
    torch.manual_seed(0)
    net = MedDisSegNet(3, 2)
    for m in net.cdfa:
        for layer in (m.value, m.proj):
            assert layer.weight.abs().max() <= 128 ** -0.5 and layer.bias.abs().max() > 0
    assert net.cdfa[0].output_convs[0].conv.weight.abs().max() > 128 ** -0.5


def test_parameter_breakdown_matches_reference_parts(net):
    # the parts taken over from the reference design have its exact figures (REFERENCE_NOTES, in M)
    parts = {
        "encoder": 8.543, "enhancement": 9.288, "decoupling": 15.979, "guidance": 2.954,
        "auxiliary_heads": 3.876, "cdfa": 3.272,
    }
    for name, millions in parts.items():
        assert round(_count(getattr(net, name)) / 1e6, 3) == millions, name


@pytest.mark.parametrize("size", [(64, 64), (48, 80), (50, 70)])
def test_logits_shape_in_eval_mode(net, size):
    net.eval()
    with torch.no_grad():
        y = net(torch.randn(2, 3, *size))
    assert isinstance(y, torch.Tensor) and y.shape == (2, 3, *size)
    assert torch.isfinite(y).all()


def test_padding_is_cropped_consistently(net):
    # the valid part of a padded input gives the same logits as the same image zero-padded by hand
    net.eval()
    x = torch.randn(1, 3, 50, 70)
    with torch.no_grad():
        y = net(x)
        y_manual = net(torch.nn.functional.pad(x, (0, 10, 0, 14)))[:, :, :50, :70]
    torch.testing.assert_close(y, y_manual)


def test_all_outputs_in_training(net):
    net.train()
    out = net(torch.randn(2, 3, 50, 70), output="all")
    assert isinstance(out, MedDisSegOutput)
    assert out[0] is out.logits and out.logits.shape == (2, 3, 50, 70)
    assert len(out.path_logits) == 3 and all(p.shape == (2, 3, 50, 70) for p in out.path_logits)
    torch.testing.assert_close(out.logits, sum(out.path_logits))
    for m in (out.fg, out.bg, out.uc):
        assert m is not None and m.shape == (2, 1, 50, 70)
    # features at the padded size 64x80
    assert out.features["early"].shape == (2, 256, 16, 20)
    assert out.features["middle"].shape == (2, 1024, 4, 5)
    assert out.features["late"].shape == (2, 128, 32, 40)
    assert all(f.requires_grad for f in out.features.values())


def test_all_outputs_in_eval_mode_are_those_of_training_and_the_logits_the_default_call(net):
    net.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out, logits = net(x, output="all"), net(x)
    assert isinstance(out, MedDisSegOutput) and all(m.shape == (2, 1, 32, 32) for m in (out.fg, out.bg, out.uc))
    assert out.path_logits is not None and set(out.features) == {"early", "middle", "late"}
    torch.testing.assert_close(out.logits, logits, rtol=0, atol=0)


def test_an_unknown_output_is_refused(net):
    with pytest.raises(ValueError, match=r"unknown output 'features': choose one of \['logits', 'encoder', 'all'\]"):
        net(torch.randn(1, 3, 32, 32), output="features")


@pytest.mark.parametrize("training", [False, True])
def test_logits_never_run_the_auxiliary_heads(net, training):
    net.train(training)
    calls = []
    watched = [net.auxiliary_heads, net.decoupling.uc]
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in watched]
    try:
        with torch.no_grad():
            y = net(torch.randn(2, 3, 32, 32))
    finally:
        for h in handles:
            h.remove()
    assert isinstance(y, torch.Tensor) and y.shape == (2, 3, 32, 32)
    assert calls == []
    # and the hooks do fire when the heads are used
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in watched]
    try:
        with torch.no_grad():
            net(torch.randn(2, 3, 32, 32), output="all")
    finally:
        for h in handles:
            h.remove()
    assert len(calls) == len(watched)


def test_encoder_output(net):
    net.eval()
    with torch.no_grad():
        feats = net(torch.randn(2, 3, 64, 48), output="encoder")
    assert isinstance(feats, list)
    assert [tuple(f.shape) for f in feats] == [(2, 64, 32, 24), (2, 256, 16, 12), (2, 512, 8, 6), (2, 1024, 4, 3)]


def test_elat_off_encoder_output_is_plain_resnet():
    torch.manual_seed(0)
    m = MedDisSegNet(3, 2, elat=False).eval()
    assert all(isinstance(e, nn.Identity) for e in m.elat)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for a, b in zip(m(x, output="encoder"), m.encoder(x)):
            torch.testing.assert_close(a, b)
    assert m(x).shape == (2, 2, 32, 32)


@pytest.mark.e2e  # backward through the whole network, several times (the quick loop leaves it out)
def test_all_parameters_receive_gradients_in_training():
    # nnU-Net's DDP needs every parameter in the graph in Stage II (deep supervision on, training)
    torch.manual_seed(0)
    for fusion in ("sum", "concat"):
        m = MedDisSegNet(1, 2, decoder_fusion=fusion).train()
        out = m(torch.randn(2, 1, 32, 32), output="all")
        loss = out.logits.mean() + out.fg.mean() + out.bg.mean() + out.uc.mean()
        loss = loss + sum(f.mean() for f in out.features.values())
        loss.backward()
        missing = [n for n, p in m.named_parameters() if p.grad is None]
        assert missing == [], (fusion, missing[:5])
        assert (out.path_logits is None) == (fusion == "concat")


def test_relu_and_no_elat_variants(net):
    m = MedDisSegNet(3, 3, activation="relu", elat=False).eval()
    assert not any(type(mod).__name__ == "TeLU" for mod in m.modules())
    assert isinstance(m.decoder.small.cbat.channel.mlp[1], nn.ReLU)
    with torch.no_grad():
        assert m(torch.randn(2, 3, 32, 32)).shape == (2, 3, 32, 32)
    assert _count(m) == _count(net) - _count(net.elat)


def test_parameter_groups_partition(net):
    m = net
    enc = list(m.encoder_parameters())
    rest = list(m.non_encoder_parameters())
    enc_ids, rest_ids = {id(p) for p in enc}, {id(p) for p in rest}
    all_ids = {id(p) for p in m.parameters()}
    assert len(enc_ids) == len(enc) and len(rest_ids) == len(rest)
    assert not enc_ids & rest_ids
    assert enc_ids | rest_ids == all_ids
    assert {id(p) for p in m.elat.parameters()} <= enc_ids
    assert {id(p) for p in m.decoder.parameters()} <= rest_ids


@pytest.mark.parametrize(
    "kwargs",
    [
        {"conv_op": nn.Conv3d},
        {"conv_op": "torch.nn.modules.conv.Conv3d"},
        {"norm_op": nn.BatchNorm3d},
        {"activation": "gelu"},
        {"decoder_fusion": "mean"},
        {"conv_op": "torch.nn.NoSuchConv"},
    ],
)
def test_invalid_configurations(kwargs):
    with pytest.raises(ValueError):
        MedDisSegNet(3, 2, **kwargs)


def test_three_d_conv_error_message():
    with pytest.raises(ValueError, match="2D only.*Conv3d"):
        MedDisSegNet(1, 2, conv_op=nn.Conv3d)


@pytest.mark.parametrize("shape", [(2, 3, 1, 32, 32), (3, 32, 32)])
def test_non_2d_input_rejected(net, shape):
    net.eval()
    with pytest.raises(ValueError, match=r"2D only.*\(B, C, H, W\)"):
        net(torch.randn(*shape))


def test_wrong_channel_count_rejected(net):
    with pytest.raises(ValueError, match="input channels"):
        net(torch.randn(1, 1, 32, 32))


def test_encoder_weights_are_loaded(tmp_path):
    torch.manual_seed(0)
    ref = torchvision.models.resnet50(weights=None)
    path = tmp_path / "imagenet.pth"
    torch.save(ref.state_dict(), path)
    m = MedDisSegNet(1, 2, encoder_weights=str(path))
    torch.testing.assert_close(m.encoder.conv1.weight, ref.conv1.weight.mean(1, keepdim=True))
    torch.testing.assert_close(m.encoder.layer3[2].conv2.weight, ref.layer3[2].conv2.weight)
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        MedDisSegNet(3, 2, encoder_weights=str(tmp_path / "missing.pth"))


@pytest.mark.parametrize("req_import", [[], ["conv_op", "norm_op"]])
def test_built_by_nnunet_get_network_from_plans(req_import):
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    arch_kwargs = {
        "encoder_weights": None,
        "elat": True,
        "activation": "telu",
        "decoder_fusion": "sum",
        "conv_op": "torch.nn.modules.conv.Conv2d",
        "norm_op": "torch.nn.modules.batchnorm.BatchNorm2d",
        "norm_op_kwargs": {"eps": 1e-5, "affine": True},
    }
    network = get_network_from_plans(
        "nnunetv2_meddisseg.architectures.MedDisSegNet", arch_kwargs, req_import, 3, 4,
        allow_init=True, deep_supervision=True,
    )
    assert isinstance(network, MedDisSegNet)
    network.train()
    out = network(torch.randn(2, 3, 32, 32), output="all")
    assert isinstance(out, MedDisSegOutput) and out.logits.shape == (2, 4, 32, 32) and out.fg is not None
    # nnU-Net's switch (network.decoder.deep_supervision, on or off) changes nothing: a plain call gives logits
    for switch in (True, False):
        network.decoder.deep_supervision = switch
        y = network(torch.randn(2, 3, 32, 32))
        assert isinstance(y, torch.Tensor) and y.shape == (2, 4, 32, 32)


@pytest.mark.parametrize("op", [nn.InstanceNorm2d, "torch.nn.modules.instancenorm.InstanceNorm2d"])
def test_added_norm_op_normalises_the_added_blocks_and_the_encoder_keeps_its_own(op):
    from nnunetv2_meddisseg.blocks.norm import UncountedBatchNorm2d as BatchNorm2d

    net = MedDisSegNet(3, 2, added_norm_op=op, added_norm_op_kwargs={"affine": True})
    encoder = set(net.encoder.modules())
    norms = [(m in encoder, type(m)) for m in net.modules() if isinstance(m, (nn.BatchNorm2d, nn.InstanceNorm2d))]
    assert {t for inside, t in norms if inside} == {BatchNorm2d}
    assert {t for inside, t in norms if not inside} == {nn.InstanceNorm2d}
    assert sum(not inside for inside, _ in norms) > 40  # every added block, not one of them
    assert all(m.affine and not m.track_running_stats for m in net.modules() if isinstance(m, nn.InstanceNorm2d))
    assert net.added_norm == (nn.InstanceNorm2d, {"affine": True})
    assert _count(net) == _count(MedDisSegNet(3, 2))  # affine InstanceNorm has BatchNorm's parameters
    net.eval()
    with torch.no_grad():
        assert net(torch.randn(1, 3, 32, 32)).shape == (1, 2, 32, 32)


def test_added_norm_defaults_to_the_network_norm():
    net = MedDisSegNet(3, 2, norm_op=nn.BatchNorm2d, norm_op_kwargs={"eps": 1e-3})
    assert net.added_norm == (nn.BatchNorm2d, {"eps": 1e-3})
    assert {type(m) for m in net.modules() if isinstance(m, nn.modules.batchnorm._NormBase)} == {nn.BatchNorm2d}
    assert all(m.eps == 1e-3 for m in net.modules() if isinstance(m, nn.BatchNorm2d))


def test_three_d_added_norm_is_refused():
    with pytest.raises(ValueError, match="added_norm_op must be a 2D normalisation"):
        MedDisSegNet(3, 2, added_norm_op=nn.InstanceNorm3d)
