"""The compile decision by hand, and the trainer's fallback around the final validation (no compilation runs)."""
import pytest
import torch
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from test_trainer_meddisseg import MEDDISSEG, make_trainer, tiny_plans
from torch._dynamo.exc import TorchDynamoException

from nnunetv2_meddisseg.environment import COMPILE_VARIABLE
from nnunetv2_meddisseg.training.compilation import COMPILE_COSTS, CompileCosts, CompileDecision, compile_pays
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg
from nnunetv2_meddisseg.training.variants import nnUNetTrainerMedDisSeg_100epochs, nnUNetTrainerMedDisSeg_smoke

COSTS = CompileCosts(compile_s=10.0, eager_s_per_sample=0.05, saved_fraction=0.5, pixels=100)


def test_compile_pays_when_the_saving_exceeds_the_compile_seconds_by_hand():
    # each iteration saves 0.5 x 0.05 s x batch 2 = 0.05 s; two stages cost 2 x 10 s
    assert not compile_pays([100, 300], 2, 100, COSTS).compile  # 400 x 0.05 = 20 s: no more than 20 s
    assert compile_pays([100, 301], 2, 100, COSTS).compile  # 20.05 s > 20 s
    # a stage without iterations compiles nothing: one graph, 10 s, repaid by 201 iterations
    assert not compile_pays([0, 200], 2, 100, COSTS).compile and compile_pays([0, 201], 2, 100, COSTS).compile
    # the saving scales with the patch's pixels: a quarter of the pixels needs four times the iterations
    assert not compile_pays([0, 799], 2, 25, COSTS).compile and compile_pays([0, 801], 2, 25, COSTS).compile
    assert not compile_pays([0, 0], 2, 100, COSTS).compile


def test_the_decision_line_gives_its_figures():
    line = compile_pays([100, 301], 2, 100, COSTS).log_line()
    assert line.startswith("torch.compile: on (401 training iterations x 0.0500 s saved each = 20 s > 20 s")
    assert "nnUNet_compile" in line


def _deciding(monkeypatch, cls, patch, nnunet_compiles=True, setting=None):
    """The trainer's decision where nnU-Net would (not) compile and ``nnUNet_compile`` is ``setting``."""
    monkeypatch.setattr(nnUNetTrainer, "_do_i_compile", lambda self: nnunet_compiles)
    if setting is None:
        monkeypatch.delenv(COMPILE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(COMPILE_VARIABLE, setting)
    trainer = make_trainer(cls, plans=tiny_plans(MEDDISSEG, patch_size=patch), initialize=False)
    trainer._set_batch_size_and_oversample()
    return trainer


@pytest.mark.parametrize("cls, compiles", [(nnUNetTrainerMedDisSeg_smoke, False),
                                           (nnUNetTrainerMedDisSeg_100epochs, True),
                                           (nnUNetTrainerMedDisSeg, True)])
def test_the_trainer_decides_by_its_schedule_where_nnunet_would_compile(nnunet_dirs, monkeypatch, cls, compiles):
    trainer = _deciding(monkeypatch, cls, (256, 256))
    iterations = trainer.num_epochs * trainer.num_iterations_per_epoch
    saved = COMPILE_COSTS.saved_fraction * COMPILE_COSTS.eager_s_per_sample * trainer.batch_size * iterations
    graphs = 1 + (0 < trainer.stage1_epochs < trainer.num_epochs)
    assert (saved > graphs * COMPILE_COSTS.compile_s) == compiles  # the rule by hand, at the figures' 256x256
    assert trainer._do_i_compile() is compiles
    with open(trainer.log_file) as f:
        lines = [line for line in f if "torch.compile: " in line]
    assert len(lines) == 1 and f"torch.compile: {'on' if compiles else 'off'} (" in lines[0]
    trainer._do_i_compile()  # decided once, logged once
    with open(trainer.log_file) as f:
        assert sum("torch.compile: " in line for line in f) == 1


@pytest.mark.parametrize("setting, nnunet_compiles", [("t", True), ("f", False)])
def test_nnunet_compile_overrides_the_decision(nnunet_dirs, monkeypatch, setting, nnunet_compiles):
    trainer = _deciding(monkeypatch, nnUNetTrainerMedDisSeg_smoke, (256, 256), nnunet_compiles, setting)
    assert trainer._do_i_compile() is nnunet_compiles


def test_no_decision_where_nnunet_does_not_compile(nnunet_dirs, monkeypatch):
    trainer = _deciding(monkeypatch, nnUNetTrainerMedDisSeg, (256, 256), nnunet_compiles=False)
    assert trainer._do_i_compile() is False
    with open(trainer.log_file) as f:
        assert any("torch.compile: off (nnU-Net does not compile on cpu)" in line for line in f)


def test_a_compile_error_in_the_final_validation_repeats_it_eagerly(nnunet_dirs, monkeypatch):
    """The final validation runs behind the same fallback as the training steps: an error of torch.compile there
    drops the compiled network and validates again with the plain one."""
    monkeypatch.setattr(nnUNetTrainerMedDisSeg, "_decide_compilation", lambda self: CompileDecision(True, "forced"))
    trainer = make_trainer(nnUNetTrainerMedDisSeg_smoke, plans=tiny_plans(MEDDISSEG), compile_backend="eager")
    assert trainer.compiled and trainer.network is not trainer._plain_network()
    calls = []

    def validation(self, save_probabilities=False):
        calls.append(self.network is self._plain_network())
        if len(calls) == 1:
            raise TorchDynamoException("no kernel for this graph")

    monkeypatch.setattr(nnUNetTrainer, "perform_actual_validation", validation)
    trainer.perform_actual_validation()
    assert calls == [False, True] and not trainer.compiled
    with open(trainer.log_file) as f:
        failed = [line for line in f if "torch.compile failed" in line]
    assert len(failed) == 1 and "no kernel for this graph" in failed[0]


def test_other_errors_of_the_final_validation_are_not_swallowed(nnunet_dirs, monkeypatch):
    trainer = make_trainer(nnUNetTrainerMedDisSeg_smoke, plans=tiny_plans(MEDDISSEG))

    def validation(self, save_probabilities=False):
        raise FileNotFoundError("no validation cases")

    monkeypatch.setattr(nnUNetTrainer, "perform_actual_validation", validation)
    with pytest.raises(FileNotFoundError, match="no validation cases"):
        trainer.perform_actual_validation()
    assert torch.is_tensor(next(trainer._plain_network().parameters()))
