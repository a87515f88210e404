"""A channels-last forward of the default plans' network stays channels-last: every convolution and every
bilinear up-sampling receives a tensor whose channels are the innermost axis (a layout change in between
would cost a copy on a GPU, and PyTorch's NCHW up-sampling kernel is far slower than its NHWC one)."""
import pytest
import torch
import torch.nn.functional as F
from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
from torch.overrides import TorchFunctionMode

from nnunetv2_meddisseg.blocks.conv import memory_format_of
from nnunetv2_meddisseg.plans_architecture import architecture_entry

WATCHED = {F.conv2d, F.interpolate, torch.conv2d}


class _LayoutRecorder(TorchFunctionMode):
    """Records (function name, input shape, strides) of every watched call whose input is not channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.not_channels_last = 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in WATCHED and isinstance(args[0], torch.Tensor):
            self.calls += 1
            one_pixel = args[0].shape[-2:] == (1, 1)  # both layouts are the same memory
            if memory_format_of(args[0]) != torch.channels_last and not one_pixel:
                self.not_channels_last.append((func.__name__, tuple(args[0].shape), args[0].stride()))
        return func(*args, **(kwargs or {}))


def _network():
    entry = architecture_entry()
    torch.manual_seed(0)
    return get_network_from_plans(entry["network_class_name"], dict(entry["arch_kwargs"]), entry["_kw_requires_import"],
                                  3, 2, allow_init=True)


def test_memory_format_of_channel_slices():
    x = torch.randn(2, 8, 5, 6)
    assert memory_format_of(x) == torch.contiguous_format
    cl = x.contiguous(memory_format=torch.channels_last)
    assert memory_format_of(cl) == torch.channels_last
    assert memory_format_of(cl[:, 2:6]) == torch.channels_last  # a channel slice keeps its layout
    assert memory_format_of(x[:, 2:6]) == torch.contiguous_format


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_channels_last_forward_keeps_every_convolution_and_upsampling_channels_last(training):
    net = _network().train(training).to(memory_format=torch.channels_last)
    output = "all" if training else "logits"
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.set_grad_enabled(training), _LayoutRecorder() as recorder:
        out = net(x.contiguous(memory_format=torch.channels_last), output=output)
    assert recorder.calls > 100  # the watch sees the network's convolutions and up-samplings
    assert recorder.not_channels_last == []
    reference = _network().train(training)
    reference.load_state_dict(net.state_dict())
    with torch.set_grad_enabled(training):
        expected = reference(x, output=output)
    logits, expected_logits = (out.logits, expected.logits) if training else (out, expected)
    # the same function; summation orders differ between the layouts' kernels (batch statistics in training)
    assert float((logits - expected_logits).norm() / expected_logits.norm()) < 1e-3
