"""torch.compile sees Med-DisSeg's training forward with the Stage II loss, and its inference forward,
as one graph each (``torch._dynamo.explain``: 0 graph breaks), in the graph and shifted forms of its
device-dependent blocks (the shifted form's hundreds of view operations make its tracing slow: marked
``slow``); and the Stage I -> Stage II switch of nnUNetTrainerMedDisSeg (encoder features -> every output,
batch of 2B -> B) compiles at most one new graph. Tracing only (backend "eager"): no inductor.
"""
import pytest
import torch
import torch._dynamo
from compile_check import graph_breaks
from torch._dynamo.utils import counters

from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.blocks.device_forms import set_implementation_form
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.objectives import recipe_stage2_loss


def _inputs(batch=2, size=32):
    g = torch.Generator().manual_seed(1)
    target = torch.zeros(batch, 1, size, size)
    target[:, :, 4:20, 8:24] = 1
    return torch.randn(batch, 3, size, size, generator=g), target


def _stage2_objective(net):
    loss = recipe_stage2_loss(nnUNetTrainerMedDisSeg.recipe)

    def objective(x, target):
        return loss(net(x, output="all"), target)
    return objective


FORMS = ["graph", pytest.param("shifted", marks=pytest.mark.slow)]


@pytest.mark.parametrize("form", FORMS)
def test_training_forward_with_stage2_loss_is_one_graph(form):
    torch.manual_seed(0)
    net = MedDisSegNet(3, 2).train()
    set_implementation_form(net, form)
    breaks, reasons = graph_breaks(_stage2_objective(net), *_inputs())
    assert breaks == 0, reasons


@pytest.mark.parametrize("form", FORMS)
def test_inference_forward_is_one_graph(form):
    torch.manual_seed(0)
    net = MedDisSegNet(3, 2).eval()
    set_implementation_form(net, form)
    with torch.no_grad():
        breaks, reasons = graph_breaks(net, _inputs()[0])
    assert breaks == 0, reasons


def test_stage_switch_compiles_at_most_one_new_graph():
    torch.manual_seed(0)
    torch._dynamo.reset()
    counters.clear()
    net = MedDisSegNet(3, 2).train()
    set_implementation_form(net, "graph")
    compiled = torch.compile(net, backend="eager")
    x, target = _inputs()
    for _ in range(2):  # Stage I: clean and perturbed views as one batch of 2B
        compiled(torch.cat([x, x]), output="encoder")
    stage1_graphs = counters["stats"]["unique_graphs"]
    for _ in range(3):  # Stage II: the full network on batches of B
        out = compiled(x, output="all")
    assert stage1_graphs >= 1 and out.fg is not None
    assert counters["stats"]["unique_graphs"] - stage1_graphs <= 1, dict(counters["stats"])
    torch._dynamo.reset()
