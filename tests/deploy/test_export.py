"""deploy/export.py without a trained model: the check's figures, what the exporter refuses, and its one-line
errors. The export of trained models is in tests/e2e/test_onnx_deploy.py."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from nnunetv2_meddisseg.deploy import export
from nnunetv2_meddisseg.errors import UserError


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()


def test_check_measures_the_difference_relative_to_the_logits():
    rng = np.random.default_rng(0)
    inputs = {"a": rng.standard_normal((2, 3, 8, 8), dtype=np.float32),
              "b": rng.standard_normal((1, 3, 12, 20), dtype=np.float32)}
    net = _net(0)
    model = export.trace_to_onnx(net, torch.zeros(1, 3, 8, 8))
    checks = export.compare_with_onnxruntime(net, model, inputs)
    assert [c["input"] for c in checks] == ["a", "b"] and checks[1]["shape"] == [1, 3, 12, 20]
    assert all(c["relative_difference"] < 1e-5 for c in checks)
    # another network's graph: the check sees it
    wrong = export.compare_with_onnxruntime(_net(1), model, inputs)
    for c in wrong:
        assert c["relative_difference"] > 0.05
        assert c["relative_difference"] == pytest.approx(c["max_abs_difference"] / c["max_abs_logit"])


def _predictor(patch=(32, 32), spacing=(1.0, 1.0), ending=".png", previous=None, reader="NaturalImage2DIO"):
    cm = SimpleNamespace(patch_size=list(patch), spacing=list(spacing), previous_stage_name=previous)
    pm = SimpleNamespace(plans={"image_reader_writer": reader})
    return SimpleNamespace(configuration_manager=cm, plans_manager=pm, dataset_json={"file_ending": ending})


@pytest.mark.parametrize("kwargs,message", [
    (dict(patch=(16, 32, 32)), "'3d_fullres' is 3D: the ONNX export and predictor handle 2D configurations only"),
    (dict(previous="3d_lowres"), "cascaded configurations"),
    (dict(ending=".nii.gz"), "'.nii.gz' files: the ONNX predictor reads 2D natural images"),
    (dict(spacing=(0.5, 1.0)), "would resample the images"),
    (dict(reader="SimpleITKIO"), "read images with SimpleITKIO"),
])
def test_refuses_what_the_predictor_cannot_run(kwargs, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        export._refuse_unsupported(_predictor(**kwargs), "3d_fullres")
    export._refuse_unsupported(_predictor(), "2d")  # a 2D natural-image model passes


def test_missing_model_is_one_line(nnunet_dirs, capsys):
    code = export.main(["-d", "Dataset987_Nothing", "-tr", "nnUNetTrainer", "-f", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("nnUNetv2_meddisseg_export: error: ")
    assert "Dataset987_Nothing" in err and "no trained model" in err
    assert export.main(["-d", "1", "--tolerance", "0"]) == 2
    assert "--tolerance must be positive" in capsys.readouterr().err


def test_saturated_attention_keeps_its_precision_in_onnx_runtime():
    # ELAT's spatial weights near sigmoid(-15) ~ 3e-7: ONNX Runtime's Sigmoid op is only accurate to ~1e-7 absolute,
    # so the exporter traces attention_sigmoid as 1 / (1 + exp(-x)), which keeps the relative precision
    from nnunetv2_meddisseg.blocks.attention import ELAT

    torch.manual_seed(0)
    block = ELAT(16).eval()
    with torch.no_grad():
        block.spatial_fuse.bias.fill_(-15.0)
    x = np.random.default_rng(0).standard_normal((2, 16, 6, 6), dtype=np.float32)
    check = export.compare_with_onnxruntime(block, export.trace_to_onnx(block, torch.from_numpy(x)), {"x": x})[0]
    assert check["max_abs_logit"] < 1e-5  # the premise: saturated weights
    assert check["relative_difference"] < 1e-4, check


def test_export_declares_the_channel_axes_the_tracer_left_symbolic():
    import onnx
    import onnxruntime

    model = onnx.load_from_string(export.trace_to_onnx(_net(0), torch.zeros(1, 3, 8, 8)))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "Addlogits_dim_1"  # as Med-DisSeg's graph has it
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "channels"

    def channel_axes(data: bytes):
        graph = onnx.load_from_string(data).graph
        return [str(v.type.tensor_type.shape.dim[1]).strip() for v in (graph.input[0], graph.output[0])]

    assert channel_axes(model.SerializeToString()) == ['dim_param: "channels"', 'dim_param: "Addlogits_dim_1"']
    declared = export.declare_channels(model.SerializeToString(), 3, 2)
    assert channel_axes(declared) == ["dim_value: 3", "dim_value: 2"]
    session = onnxruntime.InferenceSession(declared, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == ["batch", 3, "height", "width"]
    assert session.get_outputs()[0].shape == ["batch", 2, "height", "width"]
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8), dtype=np.float32)
    assert export.compare_with_onnxruntime(_net(0), declared, {"x": x})[0]["relative_difference"] < 1e-5
    # an axis already fixed is left as it is (the predictor then refuses a graph that disagrees)
    assert channel_axes(export.declare_channels(declared, 3, 5)) == ["dim_value: 3", "dim_value: 2"]


class _GuidedAggregation(nn.Module):
    """One CDFA block on an image (B, 3, H, W), its guidance from a 1x1 convolution."""

    def __init__(self) -> None:
        super().__init__()
        from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation

        self.guide = nn.Conv2d(3, 8, 1)
        self.cdfa = ContrastDrivenAggregation(3, dim=8, num_heads=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.guide(x)
        return self.cdfa(x, g, -g)


@pytest.mark.parametrize("form", [None, "shifted"])
def test_traces_the_graph_form_and_leaves_the_network_s_form_as_it_was(form):
    torch.manual_seed(0)
    net = _GuidedAggregation().eval()
    net.cdfa.form = form
    model = export.trace_to_onnx(net, torch.zeros(1, 3, 8, 8))
    assert net.cdfa.form == form
    x = np.random.default_rng(0).standard_normal((2, 3, 12, 6), dtype=np.float32)  # another size: exact in graph form
    check = export.compare_with_onnxruntime(net, model, {"x": x})[0]
    assert check["relative_difference"] < 1e-5, check
