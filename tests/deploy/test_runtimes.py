"""The runtimes' sessions give a tile the same logits whatever it is stacked with (the server stacks the tiles of
concurrent requests; each request must get the mask the predictor command writes): a stack of tiles against the
same tiles run one by one, bit for bit, on nnU-Net's default 2D network at 64x64, in each installed runtime."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from scratch import scratch_folder

from nnunetv2_meddisseg.deploy.runtimes import OnnxRuntimeSession, OpenVinoSession, installed_runtimes


@pytest.fixture(scope="module")
def unet_graph(request, tmp_path_factory):
    from dynamic_network_architectures.architectures.unet import PlainConvUNet

    torch.manual_seed(0)
    net = PlainConvUNet(3, 5, (32, 64, 128, 256, 320), torch.nn.Conv2d, 3, (1, 2, 2, 2, 2), 2, 2, (2, 2, 2, 2),
                        conv_bias=True, norm_op=torch.nn.InstanceNorm2d, norm_op_kwargs={"eps": 1e-5, "affine": True},
                        nonlin=torch.nn.LeakyReLU, nonlin_kwargs={"inplace": True}).eval()
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(1, 3, 64, 64),), buffer, input_names=["image"], output_names=["logits"],
                      opset_version=18, dynamo=False, dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    path = scratch_folder(request, tmp_path_factory, "graph") / "unet.onnx"
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_a_tile_gets_the_same_logits_alone_and_in_a_stack(unet_graph, runtime):
    if runtime not in installed_runtimes():
        pytest.skip(f"{runtime} is not installed (an optional extra)")
    session = OnnxRuntimeSession(unet_graph, threads=2) if runtime == "onnxruntime" else OpenVinoSession(unet_graph,
                                                                                                          threads=2)
    tiles = np.random.default_rng(0).standard_normal((6, 3, 64, 64)).astype(np.float32)
    stacked = session.run(tiles)
    alone = np.concatenate([session.run(tiles[i:i + 1]) for i in range(len(tiles))])
    assert stacked.shape == (6, 2, 64, 64)
    assert np.array_equal(stacked, alone), float(np.abs(stacked - alone).max())
    assert np.array_equal(session.run(tiles[2:5]), alone[2:5])
