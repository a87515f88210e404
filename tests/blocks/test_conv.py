import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.blocks.activation import TeLU, telu
from nnunetv2_meddisseg.blocks.conv import ConvNormAct, same_padding


@pytest.mark.parametrize("kernel_size,dilation", [(1, 1), (3, 1), (3, 6), (3, 18), (7, 1)])
def test_same_padding_keeps_size(kernel_size, dilation):
    block = ConvNormAct(4, 6, kernel_size, dilation=dilation)
    assert block(torch.randn(2, 4, 20, 24)).shape == (2, 6, 20, 24)


def test_even_kernel_rejected():
    with pytest.raises(ValueError, match="odd"):
        same_padding(2)


def test_composition_matches_manual():
    torch.manual_seed(0)
    block = ConvNormAct(3, 5, 3, nonlin=TeLU).eval()
    with torch.no_grad():
        block.norm.running_mean.uniform_(-1, 1)
        block.norm.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 8, 8)
    assert isinstance(block.conv, nn.Conv2d) and block.conv.bias is None
    expected = telu(block.norm(block.conv(x)))
    torch.testing.assert_close(block(x), expected)


def test_no_activation_and_no_norm():
    block = ConvNormAct(3, 5, 1, norm_op=None, nonlin=None, conv_bias=True)
    x = torch.randn(1, 3, 4, 4)
    torch.testing.assert_close(block(x), block.conv(x))
    relu_block = ConvNormAct(3, 5, 3, nonlin=nn.ReLU)
    assert (relu_block(torch.randn(2, 3, 6, 6)) >= 0).all()
