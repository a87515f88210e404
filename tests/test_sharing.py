"""nnUNetv2_meddisseg_weights_only on a hand-made model folder (prediction from the reduced copy is
tested end to end in tests/e2e/test_cli_roundtrip.py)."""
import json

import pytest
import torch
from planted import KINDS, plant, snapshot
from torch import nn

from nnunetv2_meddisseg.sharing import PREDICTION_KEYS, main


def _checkpoint(seed: int) -> dict:
    torch.manual_seed(seed)
    net = nn.Linear(8, 4)
    optimizer = torch.optim.Adam(net.parameters())
    net(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    return {"network_weights": net.state_dict(), "optimizer_state": optimizer.state_dict(), "grad_scaler_state": None,
            "logging": {"train_losses": [0.5]}, "_best_ema": 0.3, "current_epoch": 3,
            "init_args": {"configuration": "2d", "fold": 0}, "trainer_name": "nnUNetTrainerMedDisSeg",
            "inference_allowed_mirroring_axes": (0, 1), "run_seed": 7}


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "nnUNetTrainerMedDisSeg__nnUNetMedDisSegPlans__2d"
    for fold in (0, 1):
        (folder / f"fold_{fold}" / "validation").mkdir(parents=True)
        torch.save(_checkpoint(fold), folder / f"fold_{fold}" / "checkpoint_final.pth")
        (folder / f"fold_{fold}" / "validation" / "summary.json").write_text("{}")
        (folder / f"fold_{fold}" / "progress.png").write_bytes(b"png")
    torch.save(_checkpoint(5), folder / "fold_0" / "checkpoint_best.pth")
    (folder / "plans.json").write_text(json.dumps({"plans_name": "nnUNetMedDisSegPlans"}))
    (folder / "dataset.json").write_text("{}")
    return folder


def test_copy_keeps_every_file_and_only_the_prediction_keys(model_folder, tmp_path, capsys):
    out = tmp_path / "shared"
    assert main([str(model_folder), str(out)]) == 0
    source_files = sorted(p.relative_to(model_folder) for p in model_folder.rglob("*") if p.is_file())
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == source_files
    for relative in source_files:
        if relative.suffix != ".pth":
            assert (out / relative).read_bytes() == (model_folder / relative).read_bytes()
            continue
        full = torch.load(model_folder / relative, weights_only=False)
        reduced = torch.load(out / relative, weights_only=False)
        assert set(reduced) == set(PREDICTION_KEYS)
        assert all(torch.equal(reduced["network_weights"][k], v) for k, v in full["network_weights"].items())
        assert {k: reduced[k] for k in PREDICTION_KEYS if k != "network_weights"} == \
               {k: full[k] for k in PREDICTION_KEYS if k != "network_weights"}
        assert (out / relative).stat().st_size < (model_folder / relative).stat().st_size
    assert capsys.readouterr().out.count(" MB (was ") == 3


def test_a_non_empty_output_folder_is_refused_and_kept(model_folder, tmp_path, capsys):
    out = tmp_path / "shared"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main([str(model_folder), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("nnUNetv2_meddisseg_weights_only: error: ")
    assert str(out) in err and "not an empty folder" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_bad_checkpoint_writes_nothing(model_folder, tmp_path, capsys):
    torch.save({"state_dict": {}}, model_folder / "fold_1" / "checkpoint_final.pth")
    out = tmp_path / "shared"
    assert main([str(model_folder), str(out)]) == 2
    err = capsys.readouterr().err
    assert "fold_1/checkpoint_final.pth is not an nnU-Net checkpoint: it has no network_weights" in err
    assert not out.exists()


def test_a_folder_without_plans_is_named(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert f"{tmp_path} is not a trained nnU-Net model folder" in capsys.readouterr().err


def test_a_checkpoint_carrying_code_is_refused_and_never_run(model_folder, tmp_path, capsys):
    import numpy as np
    from payload import Payload

    marker = tmp_path / "payload_ran"
    checkpoint = _checkpoint(1)
    checkpoint["logging"] = {"train_losses": [np.float64(0.5)], "ema_fg_dice": [Payload(marker)]}
    torch.save(checkpoint, model_folder / "fold_1" / "checkpoint_final.pth")
    out = tmp_path / "shared"
    assert main([str(model_folder), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fold_1/checkpoint_final.pth holds pickled objects other than tensors" in err
    assert "needs GLOBAL" in err and "it was not loaded, since loading such objects can run code" in err
    assert "weights_only=False" not in err and "weights_only` set to `False" not in err
    assert not marker.exists() and not out.exists()


def test_numpy_scalars_of_nnunet_logs_are_read(model_folder, tmp_path):
    import numpy as np

    checkpoint = _checkpoint(1)
    checkpoint["logging"] = {"train_losses": [np.float64(0.5), np.float32(0.25)], "epoch": np.int64(3)}
    checkpoint["_best_ema"] = np.float64(0.3)
    torch.save(checkpoint, model_folder / "fold_1" / "checkpoint_final.pth")
    assert main([str(model_folder), str(tmp_path / "shared")]) == 0


def test_temporaries_are_not_shared(model_folder, tmp_path):
    (model_folder / "fold_0" / "checkpoint_latest.pth.1234.tmp").write_bytes(b"half a checkpoint")
    (model_folder / ".plans.json.partial").write_text("{")
    out = tmp_path / "shared"
    assert main([str(model_folder), str(out)]) == 0
    assert not [p for p in out.rglob("*") if p.name.endswith((".tmp", ".partial"))]


@pytest.mark.parametrize("inside", ["fold_0/shared", ".", "fold_0"])
def test_an_output_folder_inside_the_model_folder_is_refused(model_folder, tmp_path, capsys, inside):
    before = sorted(model_folder.rglob("*"))
    assert main([str(model_folder), str(model_folder / inside)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is inside MODEL_FOLDER" in err
    assert "choose a folder outside the model folder" in err
    assert sorted(model_folder.rglob("*")) == before


def test_a_model_folder_inside_the_output_folder_is_refused(model_folder, tmp_path, capsys):
    assert main([str(model_folder), str(tmp_path)]) == 2
    assert "is inside MODEL_FOLDER" in capsys.readouterr().err


def test_a_failed_write_leaves_nothing_and_names_the_path(model_folder, tmp_path, capsys, monkeypatch):
    import errno

    import nnunetv2_meddisseg.sharing as sharing

    def disk_full(checkpoint, path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(sharing, "_save", disk_full)
    out = tmp_path / "shared"
    before = sorted(tmp_path.rglob("*"))
    assert main([str(model_folder), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nnUNetv2_meddisseg_weights_only: error: cannot write the copy ")
    assert "checkpoint_best.pth: No space left on device" in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("empty_before", [True, False], ids=["empty_folder", "new_folder"])
def test_files_that_appear_in_the_output_folder_while_copying_are_kept(model_folder, tmp_path, capsys, monkeypatch,
                                                                       empty_before):
    """The output folder is checked (missing or empty) before the checkpoints are read; a file someone writes there
    meanwhile stays, and the copy is refused with one line."""
    import nnunetv2_meddisseg.sharing as sharing

    out = tmp_path / "shared"
    if empty_before:
        out.mkdir()
    real_save = sharing._save

    def save_while_someone_writes(checkpoint, path):
        out.mkdir(exist_ok=True)
        (out / "results.csv").write_text("mine")
        real_save(checkpoint, path)

    monkeypatch.setattr(sharing, "_save", save_while_someone_writes)
    assert main([str(model_folder), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"nnUNetv2_meddisseg_weights_only: error: cannot write the copy "
                                                   f"{out}: "), err
    assert [p.name for p in out.iterdir()] == ["results.csv"] and (out / "results.csv").read_text() == "mine"
    assert not list(tmp_path.glob(".shared*"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_or_link_of_a_fixed_temporary_name_is_left_alone(model_folder, tmp_path, capsys, kind):
    """A user's folder, or a link to a folder outside, where the copy's temporary folder would be: the copy is
    written all the same, nothing through the link, and both stay as they were."""
    out = tmp_path / "shared"
    plant(tmp_path / ".shared.partial", kind, tmp_path / "outside")
    before = snapshot(tmp_path, leave_out=[out])
    assert main([str(model_folder), str(out)]) == 0
    assert snapshot(tmp_path, leave_out=[out]) == before  # untouched, and no temporary left
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == sorted(
        p.relative_to(model_folder) for p in model_folder.rglob("*") if p.is_file())
