"""How deep one Stage II training step goes into the package, outside the network, and that it reads no
environment variable.

Counted with ``sys.setprofile``: the distinct functions of ``nnunetv2_meddisseg`` entered during one
``train_step`` (after a first one), leaving out the network's modules (``architectures/``, ``blocks/``) and
comprehensions. The step is the trainer's ``train_step``, its input check and report, and the loss maths.
"""
import os
import sys
from collections import Counter
from pathlib import Path

import nnunetv2_meddisseg
from nnunetv2_meddisseg.training.stages import STAGE_2
from tests.training.test_trainer_meddisseg import MEDDISSEG, make_batch, make_trainer, tiny_plans

PACKAGE = Path(nnunetv2_meddisseg.__file__).parent
NETWORK = ("architectures", "blocks")

#: at most this many package functions per Stage II step (one explicit train_step on a loss built per stage)
MOST_FUNCTIONS = 19


class RecordingEnvironment(dict):
    """``os.environ``'s values, recording every name the package reads (torch reads some of its own)."""

    def __init__(self, values) -> None:
        super().__init__(values)
        self.read = []

    def _record(self, name) -> None:
        caller = sys._getframe(2).f_code
        if PACKAGE in Path(caller.co_filename).parents:
            self.read.append((caller.co_filename, name))

    def __getitem__(self, name):
        self._record(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self._record(name)
        return super().get(name, default)

    def __contains__(self, name):
        self._record(name)
        return super().__contains__(name)


def _package_function(code) -> tuple:
    path = Path(code.co_filename)
    if PACKAGE not in path.parents or code.co_name.startswith("<"):
        return ()
    relative = path.relative_to(PACKAGE)
    if relative.parts[0] in NETWORK:
        return ()
    return (relative.as_posix(), code.co_name)


def test_a_stage2_step_crosses_few_package_functions_and_reads_no_environment(nnunet_dirs, monkeypatch):
    trainer = make_trainer(plans=tiny_plans(MEDDISSEG))
    trainer._enter_stage(STAGE_2)
    batch = make_batch()
    trainer.train_step(batch)  # the first step of a stage does one-off work (diagnostics, compile decision)
    entered = Counter()

    def profile(frame, event, arg):
        if event == "call":
            function = _package_function(frame.f_code)
            if function:
                entered[function] += 1

    environment = RecordingEnvironment(os.environ)
    monkeypatch.setattr(os, "environ", environment)
    sys.setprofile(profile)
    try:
        trainer.train_step(batch)
    finally:
        sys.setprofile(None)
    assert ("training/nnUNetTrainerMedDisSeg.py", "train_step") in entered  # the profile saw the step
    assert len(entered) <= MOST_FUNCTIONS, sorted(entered)
    assert environment.read == []
