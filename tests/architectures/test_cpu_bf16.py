"""The opt-in CPU bfloat16 inference switch of MedDisSegNet (``cpu_bf16``; by default the environment variable
nnUNet_meddisseg_cpu_bf16 where the network is built)."""
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from nnunetv2_meddisseg.architectures import meddisseg
from nnunetv2_meddisseg.architectures.meddisseg import MedDisSegNet
from nnunetv2_meddisseg.environment import CPU_BF16_ENVIRONMENT_VARIABLE as CPU_BF16_ENV

#: Agreement of the arg-max maps of a network trained for TRAINING_STEPS steps at 32x32 (batch 4),
#: fp32 vs bf16 on 8 held-out images. Measured in 5 trainings (2 seeds of this test, 3 of a variant
#: with 30 steps on the generated polyp-like images): at most 0.9 % of an image's pixels differed,
#: at most 0.4 % over the 8 images. Tolerance with about 3x margin:
MAX_DISAGREEMENT_PER_IMAGE = 0.03
MAX_DISAGREEMENT_OVERALL = 0.015
TRAINING_STEPS = 15


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return MedDisSegNet(3, 2, cpu_bf16=False)


@pytest.fixture
def bf16_cpu(monkeypatch, net):
    """The switch on (``net``'s, and the variable for networks built now), on a CPU treated as bf16-capable
    (autocast runs on any CPU, natively or not)."""
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    monkeypatch.setattr(net, "cpu_bf16", True)
    monkeypatch.setattr(meddisseg, "cpu_supports_bf16", lambda: True)


def _mode(net, training: bool):
    net.train(training)
    return net


def _forward_dtypes(net, x, output: str = "logits"):
    """(dtype of an inner convolution's output, the network's logits) for one forward of x."""
    seen = []
    conv = net.cdfa[0].modules()
    conv = next(m for m in conv if isinstance(m, torch.nn.Conv2d))
    handle = conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        with torch.no_grad():
            out = net(x, output=output)
    finally:
        handle.remove()
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return seen[0], logits


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("T", True), ("0", False), ("", False),
                                       ("no", False)])
def test_switch_values(monkeypatch, value, on):
    monkeypatch.setenv(CPU_BF16_ENV, value)
    assert meddisseg.cpu_bf16_requested() is on


def test_switch_off_by_default(monkeypatch):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    net = MedDisSegNet(3, 2)
    assert net.cpu_bf16 is False
    inner, logits = _forward_dtypes(_mode(net, training=False), torch.randn(1, 3, 32, 32))
    assert inner == torch.float32 and logits.dtype == torch.float32


def test_the_variable_is_read_where_the_network_is_built_not_in_forward(monkeypatch):
    monkeypatch.setattr(meddisseg, "cpu_supports_bf16", lambda: True)
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    on = _mode(MedDisSegNet(3, 2), training=False)
    assert on.cpu_bf16 is True and MedDisSegNet(3, 2, cpu_bf16=False).cpu_bf16 is False
    monkeypatch.delenv(CPU_BF16_ENV)
    assert _forward_dtypes(on, torch.randn(1, 3, 32, 32))[0] == torch.bfloat16  # unset later: still on
    off = _mode(MedDisSegNet(3, 2), training=False)
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert off.cpu_bf16 is False and _forward_dtypes(off, torch.randn(1, 3, 32, 32))[0] == torch.float32


def test_switch_runs_inference_in_bf16_and_returns_fp32(bf16_cpu, net):
    x = torch.randn(1, 3, 32, 48)
    inner, logits = _forward_dtypes(_mode(net, training=False), x)
    assert inner == torch.bfloat16
    assert logits.dtype == torch.float32 and logits.shape == (1, 2, 32, 48)


@pytest.mark.parametrize("training, output", [(True, "logits"), (True, "all"), (False, "all")])
def test_training_and_all_output_forwards_stay_fp32(bf16_cpu, net, training, output):
    # training steps and the analysis of every output are unchanged
    inner, logits = _forward_dtypes(_mode(net, training), torch.randn(2, 3, 32, 32), output)
    assert inner == torch.float32 and logits.dtype == torch.float32
    net.eval()


def test_cuda_inputs_are_left_alone(bf16_cpu, net):
    _mode(net, training=False)
    assert net._cpu_bf16_inference(torch.zeros(1), "logits")
    # a CUDA input (simulated: only its device is read) never takes the CPU autocast path
    assert not net._cpu_bf16_inference(SimpleNamespace(device=torch.device("cuda", 0)), "logits")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_forward_is_unchanged(bf16_cpu):
    torch.manual_seed(0)
    net = _mode(MedDisSegNet(3, 2).cuda(), training=False)
    x = torch.randn(1, 3, 32, 32, device="cuda")
    inner, logits = _forward_dtypes(net, x)
    assert inner == torch.float32 and logits.dtype == torch.float32


def test_cpu_without_bf16_warns_once_and_runs_fp32(monkeypatch, net):
    monkeypatch.setattr(net, "cpu_bf16", True)
    monkeypatch.setattr(meddisseg, "_cpu_bf16_flags", lambda: False)
    meddisseg.cpu_supports_bf16.cache_clear()
    meddisseg._warn_no_cpu_bf16.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dtypes = [_forward_dtypes(_mode(net, training=False), torch.randn(1, 3, 32, 32)) for _ in range(2)]
    finally:
        meddisseg.cpu_supports_bf16.cache_clear()
        meddisseg._warn_no_cpu_bf16.cache_clear()
    assert all(inner == torch.float32 and logits.dtype == torch.float32 for inner, logits in dtypes)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and CPU_BF16_ENV in messages[0] and "fp32" in messages[0]


def _cpuinfo_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        pytest.skip("no /proc/cpuinfo to compare with")


def test_cpu_detection_agrees_with_cpuinfo_flags(monkeypatch):
    flags = _cpuinfo_flags()
    expected = bool(flags & {"avx512_bf16", "amx_bf16"})
    assert meddisseg._cpu_bf16_flags() is expected
    # without torch's private checks the flags are read from /proc/cpuinfo
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert meddisseg._cpu_bf16_flags() is expected


def _blobs(generator: torch.Generator, n: int, size: int):
    """n noisy images (n, 3, size, size) of one bright disc each, and the disc masks (n, size, size)."""
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    centre = torch.rand(n, 2, generator=generator) * size * 0.6 + size * 0.2
    radius = torch.rand(n, generator=generator) * size * 0.15 + size * 0.12
    inside = (yy - centre[:, 0, None, None]) ** 2 + (xx - centre[:, 1, None, None]) ** 2 <= radius[:, None, None] ** 2
    y = inside.long()
    return y[:, None].float().repeat(1, 3, 1, 1) + 0.5 * torch.randn(n, 3, size, size, generator=generator), y


@pytest.mark.e2e  # trains the whole network (the quick loop leaves it out)
def test_trained_network_bf16_predictions_agree_with_fp32(monkeypatch):
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = _mode(MedDisSegNet(3, 2), training=True)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(TRAINING_STEPS):
        x, y = _blobs(generator, 4, 32)
        loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # it learnt (measured: about 0.8 -> 0.35); the mean of the last three steps, as single steps of a batch of 4
    # fluctuate by +-0.1 (and with the rounding of the thread count: 0.34 at one thread, 0.45 at two)
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0], losses
    x, y = _blobs(generator, 8, 32)
    net.eval()
    with torch.no_grad():
        net.cpu_bf16 = False
        fp32 = net(x)
        net.cpu_bf16 = True
        monkeypatch.setattr(meddisseg, "cpu_supports_bf16", lambda: True)
        bf16 = net(x)
    assert fp32.dtype == bf16.dtype == torch.float32
    assert not torch.equal(fp32, bf16)  # the bf16 forward did compute differently
    disagreement = (fp32.argmax(1) != bf16.argmax(1)).float().mean(dim=(1, 2))
    assert disagreement.max() <= MAX_DISAGREEMENT_PER_IMAGE, disagreement.tolist()
    assert disagreement.mean() <= MAX_DISAGREEMENT_OVERALL, disagreement.tolist()


def test_switch_keeps_encoder_fp32_and_moves_weights_to_channels_last(bf16_cpu):
    torch.manual_seed(0)
    net = _mode(MedDisSegNet(3, 2), training=False)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: seen.setdefault(name, o))
             for name, m in (("stem", net.encoder.conv1), ("elat", net.elat[0]), ("decoder", net.enhancement[0]))]
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        logits = net(x)
    for h in hooks:
        h.remove()
    assert seen["stem"].dtype == seen["elat"].dtype == torch.float32
    assert seen["decoder"].dtype == torch.bfloat16
    assert logits.dtype == torch.float32 and logits.is_contiguous()
    conv = net.cdfa[0].input_convs[0].conv.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # same values, another memory layout
    # switched off again, the network computes what a never-converted copy computes (up to the rounding
    # of another convolution algorithm for the other layout: seen 1.8e-4)
    reference = _mode(MedDisSegNet(3, 2, cpu_bf16=False), training=False)
    reference.load_state_dict(before)
    net.cpu_bf16 = False
    with torch.no_grad():
        torch.testing.assert_close(net(x), reference(x), rtol=1e-3, atol=1e-3)
