"""Checkpoints handed to nnU-Net's predictor (``torch_files``): every command of ours that lets nnU-Net load a
checkpoint (export, features, weights-only sharing, compare, the ablation's prediction) reads it weights-only
first and refuses one carrying a pickle payload (``tests/payload.py``: its unpickling would create a marker file)
without running it, and an empty, truncated or incomplete one, in one line naming the file. The predictor's own
load runs weights-only too, so a file exchanged after the check is refused as well. compare's rows of the same
mistakes are in tests/evaluation/test_compare_error_table.py."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import pytest
import torch
from payload import Payload

from nnunetv2_meddisseg import torch_files
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.torch_files import (
    UnsafeTorchFile,
    check_model_folder_checkpoints,
    initialize_predictor,
    read_checkpoint,
)

DATASET = "Dataset999_Tiny"
MODEL = "nnUNetTrainer__nnUNetPlans__2d"
_TRAINING_TESTS = str(Path(__file__).resolve().parent / "training")


def _complete(**entries) -> dict:
    """A checkpoint with the entries nnU-Net's predictor reads (and nnU-Net's logged NumPy scalars)."""
    return {"network_weights": {"w": torch.ones(3)}, "trainer_name": "nnUNetTrainer",
            "init_args": {"configuration": "2d", "fold": 0, "device": torch.device("cpu")},
            "logging": {"mean_fg_dice": [np.float64(0.5)]}, **entries}


def _payload(path: Path, marker: Path) -> None:
    torch.save(_complete(logging={"ema_fg_dice": [Payload(marker)]}), path)


def _empty(path: Path, marker: Path) -> None:
    path.write_bytes(b"")


def _truncated(path: Path, marker: Path) -> None:
    torch.save(_complete(), path)
    path.write_bytes(path.read_bytes()[:600])


def _truncated_legacy(path: Path, marker: Path) -> None:
    torch.save(_complete(), path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:300])


def _incomplete(path: Path, marker: Path) -> None:
    torch.save({"state_dict": {"w": torch.ones(3)}}, path)


#: a bad checkpoint -> what the error line says after the file's path
BAD_CHECKPOINTS: Dict[str, tuple] = {
    "payload": (_payload, " holds pickled objects other than tensors, numbers and containers (needs GLOBAL "),
    "empty": (_empty, " is empty (0 bytes)"),
    "truncated": (_truncated, " cannot be read as a checkpoint (truncated or corrupt?"),
    "truncated_legacy_format": (_truncated_legacy, " cannot be read as a checkpoint (truncated or corrupt?"),
    "incomplete": (_incomplete, " is not an nnU-Net checkpoint: it has no network_weights"),
}


def _model_folder(results: Path) -> Path:
    """``results/Dataset999_Tiny/nnUNetTrainer__nnUNetPlans__2d`` with plans.json and dataset.json (what nnU-Net's
    predictor reads before the checkpoints)."""
    folder = results / DATASET / MODEL
    (folder / "fold_0").mkdir(parents=True)
    (folder / "plans.json").write_text(json.dumps({"dataset_name": DATASET, "plans_name": "nnUNetPlans"}))
    (folder / "dataset.json").write_text(json.dumps({"channel_names": {"0": "R"}, "labels": {"background": 0, "a": 1},
                                                     "numTraining": 1, "file_ending": ".png"}))
    return folder


def _export(env, folder, tmp) -> int:
    from nnunetv2_meddisseg.deploy.export import main

    return main(["-d", "999", "-c", "2d", "-f", "0", "-tr", "nnUNetTrainer", "-p", "nnUNetPlans",
                 "-o", str(tmp / "exported")])


def _features(env, folder, tmp) -> int:
    from nnunetv2_meddisseg.evaluation.feature_space import main

    return main(["-d", "999", "-tr", "nnUNetTrainer", "--device", "cpu", "--no_tsne", "-o", str(tmp / "f.png")])


def _weights_only(env, folder, tmp) -> int:
    from nnunetv2_meddisseg.sharing import main

    return main([str(folder), str(tmp / "shared")])


#: command -> (program name, call(env, model folder, tmp) -> exit code)
COMMANDS: Dict[str, tuple] = {
    "export": ("nnUNetv2_meddisseg_export", _export),
    "features": ("nnUNetv2_meddisseg_features", _features),
    "weights_only": ("nnUNetv2_meddisseg_weights_only", _weights_only),
}


@pytest.mark.parametrize("bad", list(BAD_CHECKPOINTS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_checkpoint_is_one_line_naming_it_and_never_run(command, bad, tmp_path, nnunet_dirs, capsys):
    folder = _model_folder(nnunet_dirs["nnUNet_results"])
    checkpoint, marker = folder / "fold_0" / "checkpoint_final.pth", tmp_path / "payload_ran"
    write, expected = BAD_CHECKPOINTS[bad]
    write(checkpoint, marker)
    prog, call = COMMANDS[command]
    code = call(nnunet_dirs, folder, tmp_path)
    out, err = capsys.readouterr()
    assert not marker.exists(), "the checkpoint's pickle ran"
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    assert f"{checkpoint}{expected}" in err
    assert "weights_only=False" not in err and "weights_only` set to `False" not in err  # no unsafe advice
    assert not (tmp_path / "exported").exists() and not (tmp_path / "shared").exists()


def test_the_ablation_reads_the_checkpoint_before_nnunetv2_predict_loads_it(tmp_path, monkeypatch):
    from nnunetv2_meddisseg.ablation.runs import AblationRun, Variant

    run = AblationRun(out=tmp_path / "ablation", dataset_name=DATASET, fold="0",
                      variants={"full": Variant("nnUNetTrainer", "nnUNetPlans")}, device="cpu",
                      images=tmp_path / "imagesTs", labels=tmp_path / "labelsTs", label_values={"a": 1})
    fold = run.fold_folder("full", 0)
    fold.mkdir(parents=True)
    _payload(fold / "checkpoint_final.pth", tmp_path / "payload_ran")
    started = []
    monkeypatch.setattr(AblationRun, "_command", lambda self, command, *args, **kwargs: started.append(command))
    with pytest.raises(UnsafeTorchFile, match="it was not loaded, since loading such objects can run code") as e:
        run.predict_and_evaluate("full", 0)
    assert str(fold / "checkpoint_final.pth") in str(e.value)
    assert started == [] and not (tmp_path / "payload_ran").exists()


# ------------------------------------------------------------------------------------------------
# reading one checkpoint, and the checks of a model folder


@pytest.mark.parametrize("bad", list(BAD_CHECKPOINTS))
def test_check_model_folder_checkpoints_names_the_bad_fold(bad, tmp_path):
    folder = tmp_path / MODEL
    for fold in (0, 1, "all"):
        (folder / f"fold_{fold}").mkdir(parents=True)
        torch.save(_complete(), folder / f"fold_{fold}" / "checkpoint_best.pth")
    write, expected = BAD_CHECKPOINTS[bad]
    write(folder / "fold_1" / "checkpoint_best.pth", tmp_path / "payload_ran")
    assert check_model_folder_checkpoints(folder, [0, "all"], "checkpoint_best.pth") == [
        folder / "fold_0" / "checkpoint_best.pth", folder / "fold_all" / "checkpoint_best.pth"]
    with pytest.raises(UserError) as e:
        check_model_folder_checkpoints(folder, ["0", "1"], "checkpoint_best.pth")
    assert f"{folder / 'fold_1' / 'checkpoint_best.pth'}{expected}" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "payload_ran").exists()


def test_a_missing_checkpoint_a_bad_fold_and_one_that_holds_no_dict(tmp_path):
    with pytest.raises(UserError, match="folds 0 x: expected fold numbers or 'all'"):
        check_model_folder_checkpoints(tmp_path, ["0", "x"])
    with pytest.raises(UserError, match=f"no trained model: {tmp_path / 'fold_0' / 'checkpoint_final.pth'} does not "
                                        f"exist"):
        check_model_folder_checkpoints(tmp_path, [0])
    torch.save([torch.ones(2)], tmp_path / "list.pth")
    with pytest.raises(UserError, match="list.pth is not an nnU-Net checkpoint: it holds a list, not a dict"):
        read_checkpoint(tmp_path / "list.pth")


def test_a_checkpoint_without_read_permission_is_one_line(tmp_path, monkeypatch):
    """Simulated (a test running as root reads any file): opening the file is refused by the system."""
    import builtins
    import errno

    path = tmp_path / "checkpoint_final.pth"
    torch.save(_complete(), path)
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file) == str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    with pytest.raises(UserError) as e:
        read_checkpoint(path)
    assert str(e.value) == f"{path} cannot be read: Permission denied"


def test_read_checkpoint_reads_tensors_and_numpy_scalars(tmp_path):
    torch.save(_complete(), tmp_path / "c.pth")
    for mmap in (None, False):
        loaded = read_checkpoint(tmp_path / "c.pth", mmap=mmap)
        assert torch.equal(loaded["network_weights"]["w"], torch.ones(3))
        assert loaded["logging"]["mean_fg_dice"] == [0.5] and loaded["init_args"]["device"] == torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# the predictor's own load


@pytest.fixture
def tiny_preprocessed(nnunet_dirs) -> None:
    """The tiny plans' preprocessed folder that trainers are made on (tests/training/test_trainer_meddisseg.py)."""
    if _TRAINING_TESTS not in sys.path:
        sys.path.append(_TRAINING_TESTS)
    from test_trainer_meddisseg import tiny_plans

    prepared = nnunet_dirs["nnUNet_preprocessed"] / tiny_plans()["dataset_name"] / "nnUNetPlans_2d"
    prepared.mkdir(parents=True)
    (prepared / "case_000.b2nd").touch()  # lets nnU-Net infer its dataset class; never read


@pytest.fixture
def trained_model(tiny_preprocessed) -> Dict[str, object]:
    """A model folder whose checkpoint nnU-Net's own trainer wrote (tiny plain U-Net, NumPy scalars logged)."""
    from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
    from test_trainer_meddisseg import DATASET_JSON, tiny_plans

    plans = tiny_plans()
    trainer = nnUNetTrainer(dict(plans, continue_training=False), "2d", 0, dict(DATASET_JSON),
                            device=torch.device("cpu"))
    trainer.initialize()
    trainer.logger.log("mean_fg_dice", np.float64(0.5), 0)  # and nnU-Net's logger its ema_fg_dice
    folder = Path(trainer.output_folder_base)
    Path(trainer.output_folder).mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(str(Path(trainer.output_folder) / "checkpoint_final.pth"))
    (folder / "plans.json").write_text(json.dumps(plans))
    (folder / "dataset.json").write_text(json.dumps(DATASET_JSON))
    return {"folder": folder, "weights": {k: v.clone() for k, v in trainer.network.state_dict().items()}}


def _exchange(checkpoint: Path, marker: Path) -> None:
    """Put a copy of ``checkpoint`` whose logging carries a payload in its place (a new file renamed over it)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the test's own file
    state["logging"] = Payload(marker)
    torch.save(state, checkpoint.with_name("exchanged.pth"))
    os.replace(checkpoint.with_name("exchanged.pth"), checkpoint)


def _predictor():
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    return nnUNetPredictor(device=torch.device("cpu"), verbose=False, allow_tqdm=False)


def test_a_trained_checkpoint_loads_through_initialize_predictor(trained_model):
    predictor = _predictor()
    initialize_predictor(predictor, trained_model["folder"], ["0"])
    loaded = predictor.list_of_parameters[0]
    assert loaded.keys() == trained_model["weights"].keys()
    assert all(torch.equal(loaded[k], v) for k, v in trained_model["weights"].items())
    assert predictor.trainer_name == "nnUNetTrainer"


def _name_trainer(checkpoint: Path, trainer: str) -> None:
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)  # the test's own file
    torch.save(dict(state, trainer_name=trainer), checkpoint)


def test_a_trainer_class_nnunet_finds_nowhere_is_one_line(trained_model, monkeypatch):
    checkpoint = trained_model["folder"] / "fold_0" / "checkpoint_final.pth"
    _name_trainer(checkpoint, "nnUNetTrainerNoSuchThing")
    monkeypatch.delenv("nnUNet_extTrainer", raising=False)
    with pytest.raises(UserError) as e:
        initialize_predictor(_predictor(), trained_model["folder"], [0])
    assert str(e.value) == (f"{checkpoint}: its trainer class nnUNetTrainerNoSuchThing is neither nnU-Net's nor this "
                            f"package's: add the folder of the module that defines it to nnUNet_extTrainer")


def test_the_packages_trainers_are_found_without_nnunet_exttrainer(trained_model, monkeypatch):
    """A model trained with one of this package's trainers loads with ``nnUNet_extTrainer`` unset (the plain
    U-Net of the tiny plans, built by nnU-Net's default architecture of a trainer that keeps it)."""
    _name_trainer(trained_model["folder"] / "fold_0" / "checkpoint_final.pth", "nnUNetTrainerBaseline")
    monkeypatch.delenv("nnUNet_extTrainer", raising=False)
    predictor = _predictor()
    initialize_predictor(predictor, trained_model["folder"], [0])
    assert predictor.trainer_name == "nnUNetTrainerBaseline"


def test_the_predictor_loads_what_was_read_weights_only(trained_model, tmp_path, monkeypatch):
    """A checkpoint exchanged after our read is never loaded: the predictor loads a copy of what was read, and
    nnU-Net's load runs with the environment as it was."""
    checkpoint = trained_model["folder"] / "fold_0" / "checkpoint_final.pth"
    marker = tmp_path / "payload_ran"
    real_read: Callable = torch_files.read_checkpoint

    def read_then_exchange(path, *args, **kwargs):
        read = real_read(path, *args, **kwargs)
        _exchange(checkpoint, marker)
        return read

    real_load, environments = torch.load, []

    def load(*args, **kwargs):
        environments.append(dict(os.environ))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch_files, "read_checkpoint", read_then_exchange)
    before = dict(os.environ)
    predictor = _predictor()
    with monkeypatch.context() as m:
        m.setattr(torch, "load", load)
        initialize_predictor(predictor, trained_model["folder"], [0])
    assert not marker.exists() and environments and all(e == before for e in environments)
    loaded = predictor.list_of_parameters[0]
    assert all(torch.equal(loaded[k], v) for k, v in trained_model["weights"].items())


def test_a_trainer_resumes_only_from_what_it_read_weights_only(tiny_preprocessed, tmp_path, monkeypatch):
    """``--c``: our trainer reads the checkpoint once, weights-only; nnU-Net's ``load_checkpoint`` loads a private
    copy of what was read: a file exchanged after the read is never loaded."""
    from test_trainer_meddisseg import make_trainer

    from nnunetv2_meddisseg.training import trainer_base

    trainer = make_trainer()
    checkpoint, marker = tmp_path / "checkpoint_latest.pth", tmp_path / "payload_ran"
    trainer.save_checkpoint(str(checkpoint))
    read = trainer_base.read_checkpoint_for_resuming

    def read_then_exchange(filename):
        entries = read(filename)
        _exchange(checkpoint, marker)
        return entries

    monkeypatch.setattr(trainer_base, "read_checkpoint_for_resuming", read_then_exchange)
    resumed = make_trainer()
    resumed.load_checkpoint(str(checkpoint))
    assert not marker.exists()
    weights = trainer.network.state_dict()
    assert all(torch.equal(v, weights[k]) for k, v in resumed.network.state_dict().items())
