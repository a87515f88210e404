"""The graph form of CDFA's window attention (blocks/cdfa_graph.py): equal to the shifted form on tiny tensors, and
traced into ONNX it stays exact at other image sizes, where the shifted form's traced graph silently is not."""
import io
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation
from nnunetv2_meddisseg.blocks.cdfa_graph import displacement_matrix, graph_window_attention
from nnunetv2_meddisseg.blocks.cdfa_shifted import displacement_sum, window_displacement_weights
from nnunetv2_meddisseg.blocks.device_forms import implementation_form_of


@pytest.mark.parametrize("kernel", [3, 5])
def test_displacement_matrix_counts_each_pair_once(kernel):
    m = displacement_matrix(kernel)
    span = 2 * kernel - 1
    assert m.shape == (span * span, kernel ** 4)
    assert torch.equal(m.sum(0), torch.ones(kernel ** 4))  # each (i, j) pair has one displacement
    # displacement 0 (the centre) is every pair with i == j
    centre = (kernel - 1) * span + kernel - 1
    diagonal = torch.eye(kernel * kernel).flatten()
    assert torch.equal(m[centre], diagonal)
    # the corner displacement (-(k-1), -(k-1)) only from the last window position to the first
    assert m[0].sum() == 1 and m[0, (kernel * kernel - 1) * kernel * kernel] == 1


@pytest.mark.parametrize("size,kernel,heads", [((7, 11), 3, 4), ((1, 1), 3, 2), ((2, 9), 3, 1), ((9, 6), 5, 2)])
def test_equals_shifted_form(size, kernel, heads):
    torch.manual_seed(0)
    window = kernel * kernel
    values = torch.randn(2, heads * 3, *size, dtype=torch.float64)
    weights = torch.softmax(torch.randn(2, heads, window, window, *size, dtype=torch.float64), dim=3)
    expected = displacement_sum(values, window_displacement_weights(weights, kernel))
    torch.testing.assert_close(graph_window_attention(values, weights, kernel), expected, rtol=1e-12, atol=1e-12)


def _traced(module, args, form):
    names = [f"x{i}" for i in range(len(args))]
    buffer = io.BytesIO()
    with implementation_form_of(module, form), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, input_names=names, output_names=["y"], opset_version=18,
                          dynamo=False, dynamic_axes={n: {0: "b", 2: "h", 3: "w"} for n in names})
    return buffer.getvalue(), names


def test_traced_graph_form_is_exact_at_other_sizes_and_the_shifted_form_is_not():
    torch.manual_seed(0)
    block = ContrastDrivenAggregation(8, 16, 2).eval()
    example = tuple(torch.randn(1, c, 8, 8) for c in (8, 16, 16))
    other = tuple(torch.randn(2, c, 12, 6) for c in (8, 16, 16))  # another batch size, height and width
    with torch.no_grad():
        expected = block(*other).numpy()  # the CPU's default (shifted) form, eager
    model, names = _traced(block, example, "graph")
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(zip(names, (
        t.numpy() for t in other))))[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    ops = Counter(node.op_type for node in onnx.load_from_string(model).graph.node)
    assert "ScatterND" not in ops and "Col2Im" not in ops
    assert sum(n for op, n in ops.items() if op != "Constant") < 600, ops
    # the shifted form's in-place writes into slices do not survive the tracer: a graph that runs, but wrong
    model, names = _traced(block, example, "shifted")
    with torch.no_grad():
        expected = block(*example).numpy()
    got = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, dict(zip(names, (
        t.numpy() for t in example))))[0]
    assert np.abs(got - expected).max() > 0.1 * np.abs(expected).max()
