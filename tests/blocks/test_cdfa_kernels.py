"""The fused CDFA ops (``blocks.cdfa_kernels``): values, gradients, written elements, layouts, dtypes,
``torch.compile`` and the whole block, checked on CPU tensors through Triton's interpreter
(``cdfa_kernel_checks.py``, run once per session in a subprocess with ``TRITON_INTERPRET=1``: the variable
must be set before Triton is first imported in a process, and this process may share Triton with other
tests); the choice of form and the argument checks in this process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

try:
    import triton  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    pytest.skip(f"Triton cannot be imported ({error}): the fused CDFA kernels need it", allow_module_level=True)

from cdfa_kernel_checks import CHECKS, SCALE
from scratch import scratch_folder

from nnunetv2_meddisseg import environment
from nnunetv2_meddisseg.blocks.cdfa import ContrastDrivenAggregation
from nnunetv2_meddisseg.blocks.cdfa_kernels import fused_cdfa_available, offset_aggregate, window_offset_weights
from nnunetv2_meddisseg.blocks.device_forms import FORMS, implementation_form, set_implementation_form

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
#: seconds the subprocess may take for all checks (they take under a minute of CPU time)
CHECKS_TIMEOUT = 600


@pytest.fixture(scope="module")
def interpreter_results(request, tmp_path_factory):
    """Runs the checks of the selected ``test_interpreted`` cases in one subprocess: {name: "" or traceback}."""
    names = [item.callspec.params["check"] for item in request.session.items
             if item.module is request.module and item.originalname == "test_interpreted"]
    results_path = scratch_folder(request, tmp_path_factory, "cdfa_kernels") / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPOSITORY), str(HERE)] + [p for p in [env.get("PYTHONPATH")] if p])
    done = subprocess.run([sys.executable, str(HERE / "cdfa_kernel_checks.py"), str(results_path), *names],
                          env=env, cwd=str(REPOSITORY), capture_output=True, text=True, timeout=CHECKS_TIMEOUT)
    if done.returncode != 0 or not results_path.exists():
        pytest.fail(f"the interpreter checks did not run (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(results_path.read_text())


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_interpreted(check, interpreter_results):
    assert interpreter_results[check] == "", interpreter_results[check]


def test_availability_and_choice_of_form(monkeypatch):
    x = torch.zeros(1)
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", True)
    assert fused_cdfa_available(x)  # under the interpreter, CPU tensors too
    assert implementation_form(x) == "shifted"  # the CPU keeps the shifted form
    for form in FORMS:
        assert implementation_form(x, form) == form
        assert ContrastDrivenAggregation(4, dim=8, num_heads=2, form=form).form == form
    assert implementation_form(x, "cuda") == "fused"  # what CUDA runs
    assert implementation_form(x, "cpu") == "shifted"
    m = ContrastDrivenAggregation(4, dim=8, num_heads=2, form="cuda")
    assert m.form == "fused"  # the alias resolved when set
    m.form = "cpu"
    assert m.form == "shifted"
    for choose in (lambda: implementation_form(x, "triton"), lambda: setattr(m, "form", "triton"),
                   lambda: ContrastDrivenAggregation(4, dim=8, num_heads=2, form="triton"),
                   lambda: set_implementation_form(m, "triton")):
        with pytest.raises(ValueError, match=r"^unknown implementation form 'triton': choose one of \["):
            choose()
    assert m.form == "shifted"  # a refused form changes nothing
    monkeypatch.setattr(environment, "TRITON_INTERPRETED", False)
    assert not fused_cdfa_available(x)
    m.form = "fused"
    with pytest.raises(RuntimeError, match="needs Triton"):
        m(torch.zeros(1, 4, 3, 3), torch.zeros(1, 8, 3, 3), torch.zeros(1, 8, 3, 3))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="logits must be"):
        window_offset_weights(torch.zeros(1, 80, 2, 2), SCALE, 1, 3)
    with pytest.raises(ValueError, match="odd"):
        window_offset_weights(torch.zeros(1, 16, 2, 2), SCALE, 1, 2)
    with pytest.raises(TypeError, match="logits must be one of"):
        window_offset_weights(torch.zeros(1, 81, 2, 2, dtype=torch.float64), SCALE, 1, 3)
    with pytest.raises(ValueError, match="S odd"):
        offset_aggregate(torch.zeros(1, 2, 2, 2), torch.zeros(1, 1, 16, 2, 2))
    with pytest.raises(ValueError, match="do not match"):
        offset_aggregate(torch.zeros(1, 3, 2, 2), torch.zeros(1, 2, 25, 2, 2))
