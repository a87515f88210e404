"""nnUNetTrainerMedDisSeg where it compiles: the network (or its blocks one by one) with static shapes, each stage
compiles its training graphs in its first epoch and none after, validation and the final validation compile
nothing, and an error of torch.compile leaves one line in the log and the run going eagerly.

Tracing only (backend "eager", no inductor), on the CPU, where nnU-Net itself would not compile: the
trainer's ``_do_i_compile`` is patched to say yes (the whole run: its compile decision).
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
from test_trainer_meddisseg import MEDDISSEG, make_batch, make_trainer, run_epoch, tiny_plans
from torch._dynamo import OptimizedModule
from torch._dynamo.utils import counters

from nnunetv2_meddisseg.training.compilation import is_compile_error
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_smoke

pytestmark = pytest.mark.e2e  # trains the whole network through the trainer


@pytest.fixture
def compiling(monkeypatch):
    """nnU-Net's compile decision says yes on the CPU; dynamo starts from empty caches and counters."""
    monkeypatch.setattr(nnUNetTrainerMedDisSeg, "_do_i_compile", lambda self: True)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def test_each_stage_compiles_in_its_first_epoch_only(nnunet_dirs, compiling):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_smoke, plans=tiny_plans(MEDDISSEG), compile_backend="eager",
                           num_epochs=4, stage1_epochs=2)
    assert trainer.compiled and isinstance(trainer.network, OptimizedModule)
    assert trainer.stage1_head._compiled_call_impl is not None  # compiled in place
    batch = make_batch()
    graphs = []
    for epoch in range(4):
        result = run_epoch(trainer, batch)
        assert np.isfinite(result["loss"])
        assert trainer.training_stage == (STAGE_1 if epoch < 2 else STAGE_2)
        graphs.append(_graphs())
    assert graphs[0] > 0 and graphs[2] > graphs[1], graphs  # Stage I, then Stage II compile their graphs
    assert graphs[1] == graphs[0] and graphs[3] == graphs[2], graphs  # and no epoch after a stage's first does
    assert trainer.compiled and trainer.stage1_head is None


def test_a_compile_error_continues_eagerly_and_says_so(nnunet_dirs, compiling):
    def failing_backend(graph_module, example_inputs):
        raise RuntimeError("no kernel for this graph")

    trainer = make_trainer(nnUNetTrainerMedDisSeg_smoke, plans=tiny_plans(MEDDISSEG), compile_backend=failing_backend,
                           num_epochs=2, stage1_epochs=1)
    assert trainer.compiled
    head = trainer.stage1_head
    batch = make_batch()
    first = run_epoch(trainer, batch)  # Stage I: the first forward fails to compile
    assert np.isfinite(first["loss"]) and not trainer.compiled
    assert trainer.network is trainer._plain_network() and head._compiled_call_impl is None
    second = run_epoch(trainer, batch)  # Stage II runs eagerly from the start
    assert np.isfinite(second["loss"]) and trainer.training_stage == STAGE_2
    with open(trainer.log_file) as f:
        lines = [line for line in f if "torch.compile failed" in line]
    assert len(lines) == 1, lines
    assert "no kernel for this graph" in lines[0] and "nnUNet_compile=f" in lines[0]


def test_errors_of_the_model_itself_are_not_taken_for_compile_errors(nnunet_dirs, compiling):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_smoke, plans=tiny_plans(MEDDISSEG), compile_backend="eager")
    bad = make_batch()
    bad["data"] = bad["data"][:, :2]  # two channels where the network takes three
    trainer.on_train_start = lambda: None
    trainer.on_epoch_start()
    trainer.on_train_epoch_start()
    with pytest.raises(Exception) as raised:
        trainer.train_step(bad)
    assert not is_compile_error(raised.value) or "channels" in str(raised.value)
    assert trainer.compiled  # the compiled blocks stay compiled


def test_a_whole_smoke_run_compiles_the_training_steps_only(preprocessed_synthetic):
    """``nnUNetv2_train``'s run in one process (``equivalence_run.py --compile``): Stage I, the switch, Stage II,
    the validation of every epoch and the final validation, with dynamo's graph count after each phase."""
    env = {**preprocessed_synthetic, "nnUNet_meddisseg_seed": "3",
           "nnUNet_results": str(Path(preprocessed_synthetic["nnUNet_results"]) / "compiled")}
    run = Path(__file__).with_name("equivalence_run.py")
    proc = subprocess.run([sys.executable, str(run), "501", "nnUNetTrainerMedDisSeg_smoke", "--compile"], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads([x for x in proc.stdout.splitlines() if x.startswith("EQUIVALENCE ")][-1][12:])
    graphs = dict(result["graphs"])
    assert list(graphs) == ["epoch 0 training", "epoch 0 validation", "epoch 1 training", "epoch 1 validation",
                            "epoch 2 training", "epoch 2 validation", "final validation"]
    assert graphs["epoch 0 training"] > 0  # Stage I compiles in its first epoch
    assert graphs["epoch 1 training"] > graphs["epoch 0 validation"]  # Stage II in its first epoch
    assert graphs["epoch 2 training"] == graphs["epoch 1 validation"]  # and no later epoch compiles
    for epoch in range(3):  # validation compiles nothing, nor does the final validation
        assert graphs[f"epoch {epoch} validation"] == graphs[f"epoch {epoch} training"]
    assert graphs["final validation"] == graphs["epoch 2 validation"]
    log = result["compile_log"]
    assert log[0] == "torch.compile: on (forced by the test)"
    assert [line.split('"')[1] for line in log if line.startswith("torch.compile: graph")] == \
        ["Stage I training", "Stage II training"]
    assert not any("failed" in line for line in log)
