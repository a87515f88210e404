import os
import socket
import urllib.error
import urllib.request

import pytest
import torch
import torchvision
from scratch import scratch_folder

from nnunetv2_meddisseg.blocks.encoder import (
    IMAGENET,
    ResNet50Encoder,
    download_imagenet_weights,
    imagenet_weights_file,
    load_resnet50_weights,
    resolve_encoder_weights,
)

# torchvision's ResNet50_Weights.IMAGENET1K_V1, as its documentation lists it
IMAGENET_URL = "https://download.pytorch.org/models/resnet50-0676ba61.pth"


def _randomise_batchnorms(model: torch.nn.Module) -> None:
    # default BN statistics (mean 0, var 1, weight 1, bias 0) would hide loading mistakes
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


@pytest.fixture(scope="module")
def torchvision_resnet(request, tmp_path_factory):
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    _randomise_batchnorms(model)
    model.eval()
    path = scratch_folder(request, tmp_path_factory, "weights") / "resnet50.pth"
    torch.save(model.state_dict(), path)
    return model, path


@pytest.fixture(scope="module")
def encoder3():
    # shared by the error tests: a failed load leaves the encoder untouched
    return ResNet50Encoder(3)


def _torchvision_features(model, x):
    x1 = model.relu(model.bn1(model.conv1(x)))
    x2 = model.layer1(model.maxpool(x1))
    x3 = model.layer2(x2)
    x4 = model.layer3(x3)
    return [x1, x2, x3, x4]


def test_shapes_and_key_layout():
    enc = ResNet50Encoder(3)
    feats = enc(torch.randn(2, 3, 64, 48))
    assert [tuple(f.shape) for f in feats] == [(2, 64, 32, 24), (2, 256, 16, 12), (2, 512, 8, 6), (2, 1024, 4, 3)]
    resnet = torchvision.models.resnet50(weights=None)
    tv_keys = {k for k in resnet.state_dict() if not k.startswith(("fc.", "layer4."))}
    assert set(enc.state_dict()) == tv_keys
    assert sum(p.numel() for p in enc.parameters()) == 8_543_296


def test_loaded_weights_reproduce_torchvision(torchvision_resnet):
    model, path = torchvision_resnet
    enc = ResNet50Encoder(3)
    load_resnet50_weights(enc, str(path))
    enc.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = enc(x)
        ref = _torchvision_features(model, x)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(enc.layer3[5].bn3.running_var, model.layer3[5].bn3.running_var)


@pytest.mark.parametrize("channels", [1, 2])
def test_stem_adaptation_for_other_channel_counts(torchvision_resnet, channels):
    model, path = torchvision_resnet
    enc = ResNet50Encoder(channels)
    load_resnet50_weights(enc, path)
    expected = model.conv1.weight.detach().mean(dim=1, keepdim=True).repeat(1, channels, 1, 1)
    assert enc.conv1.weight.shape == (64, channels, 7, 7)
    torch.testing.assert_close(enc.conv1.weight.detach(), expected)
    torch.testing.assert_close(enc.layer2[0].conv2.weight, model.layer2[0].conv2.weight)
    # a grey image given as C identical channels sees the luminance-averaged RGB filter
    enc.eval()
    x = torch.randn(1, 1, 32, 32)
    with torch.no_grad():
        out = enc.bn1(enc.conv1(x.repeat(1, channels, 1, 1)))
        ref = model.bn1(torch.nn.functional.conv2d(x, expected.sum(1, keepdim=True), stride=2, padding=3))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_missing_num_batches_tracked_is_tolerated(torchvision_resnet, tmp_path):
    model, _ = torchvision_resnet
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "old_format.pth"
    torch.save(state, path)
    enc = ResNet50Encoder(3)
    load_resnet50_weights(enc, path)
    torch.testing.assert_close(enc.conv1.weight, model.conv1.weight)


def test_missing_file(encoder3):
    with pytest.raises(FileNotFoundError, match="does_not_exist.pth"):
        load_resnet50_weights(encoder3, "/nonexistent/does_not_exist.pth")


def _save(tmp_path, obj, name="bad.pth"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def _small_state(model):
    return {k: v for k, v in model.state_dict().items() if not k.startswith(("fc.", "layer4."))}


def test_missing_key(torchvision_resnet, tmp_path, encoder3):
    state = _small_state(torchvision_resnet[0])
    del state["layer2.1.conv2.weight"]
    path = _save(tmp_path, state, "missing.pth")
    with pytest.raises(ValueError, match=r"missing\.pth.*missing key 'layer2\.1\.conv2\.weight'"):
        load_resnet50_weights(encoder3, path)


def test_unexpected_key(torchvision_resnet, tmp_path, encoder3):
    state = _small_state(torchvision_resnet[0])
    state["module.head.weight"] = torch.zeros(3)
    path = _save(tmp_path, state, "unexpected.pth")
    with pytest.raises(ValueError, match=r"unexpected\.pth.*unexpected key 'module\.head\.weight'"):
        load_resnet50_weights(encoder3, path)


def test_shape_mismatch(torchvision_resnet, tmp_path, encoder3):
    state = _small_state(torchvision_resnet[0])
    state["layer1.0.conv1.weight"] = torch.zeros(32, 64, 1, 1)
    path = _save(tmp_path, state, "shape.pth")
    with pytest.raises(ValueError, match=r"shape\.pth.*shape mismatch for key 'layer1\.0\.conv1\.weight'"):
        load_resnet50_weights(encoder3, path)


def test_stem_with_unexpected_channel_count_is_a_mismatch(torchvision_resnet, tmp_path, encoder3):
    state = _small_state(torchvision_resnet[0])
    state["conv1.weight"] = torch.zeros(64, 2, 7, 7)
    path = _save(tmp_path, state, "stem.pth")
    with pytest.raises(ValueError, match=r"stem\.pth.*'conv1\.weight'"):
        load_resnet50_weights(encoder3, path)


@pytest.mark.parametrize("obj", [[1, 2, 3], torch.zeros(3), {"conv1.weight": [1.0]}])
def test_not_a_state_dict(tmp_path, obj, encoder3):
    path = _save(tmp_path, obj, "notastate.pth")
    with pytest.raises(ValueError, match=r"notastate\.pth.*not a state dict"):
        load_resnet50_weights(encoder3, path)


def test_unreadable_file(tmp_path, encoder3):
    path = tmp_path / "garbage.pth"
    path.write_bytes(b"this is not a torch file")
    with pytest.raises(ValueError, match=r"garbage\.pth"):
        load_resnet50_weights(encoder3, path)


def _refuse(*args, **kwargs):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


@pytest.fixture
def offline(monkeypatch):
    """No network: torch.hub's downloader, urllib and sockets raise (as they do on a machine offline)."""
    monkeypatch.setattr(torch.hub, "download_url_to_file", _refuse)
    monkeypatch.setattr(urllib.request, "urlopen", _refuse)
    monkeypatch.setattr(socket.socket, "connect", _refuse)


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path / "torch_home"


def test_imagenet_file_is_where_torchvision_caches_it(torch_home):
    assert imagenet_weights_file() == str(torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth")


def test_imagenet_is_read_from_a_seeded_cache_without_network(torchvision_resnet, torch_home, offline):
    model, path = torchvision_resnet
    cached = torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(path.read_bytes())
    assert resolve_encoder_weights(IMAGENET) == str(cached)
    assert download_imagenet_weights() == str(cached)  # present: nothing to fetch
    enc = ResNet50Encoder(3)
    load_resnet50_weights(enc, resolve_encoder_weights(IMAGENET))
    assert torch.equal(enc.layer3[5].bn3.running_var, model.layer3[5].bn3.running_var)
    assert resolve_encoder_weights(str(path)) == str(path)  # a path stays a path


def _assert_offline_message(message: str, cached: str) -> None:
    assert "\n" not in message
    assert cached in message and IMAGENET_URL in message and "--encoder_weights PATH" in message


def test_imagenet_missing_from_cache_is_never_downloaded_at_resolution(torch_home, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: calls.append(a))
    with pytest.raises(FileNotFoundError) as info:
        resolve_encoder_weights(IMAGENET)
    _assert_offline_message(str(info.value), str(torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth"))
    assert calls == []


def test_imagenet_download_offline_is_one_line(torch_home, offline):
    with pytest.raises(FileNotFoundError) as info:
        download_imagenet_weights()
    _assert_offline_message(str(info.value), str(torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth"))
    assert "Temporary failure in name resolution" in str(info.value)


def test_imagenet_download_goes_through_torchvision_once(torchvision_resnet, torch_home, monkeypatch):
    _, path = torchvision_resnet
    calls = []

    def fake_download(url, dst, hash_prefix=None, progress=True):
        calls.append((url, hash_prefix))
        with open(dst, "wb") as f:
            f.write(path.read_bytes())

    monkeypatch.setattr(torch.hub, "download_url_to_file", fake_download)
    cached = str(torch_home / "hub" / "checkpoints" / "resnet50-0676ba61.pth")
    assert download_imagenet_weights() == cached and os.path.isfile(cached)
    assert download_imagenet_weights() == cached
    assert calls == [(IMAGENET_URL, "0676ba61")]  # one download, hash checked by torch.hub
