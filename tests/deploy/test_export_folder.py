"""Where nnUNetv2_meddisseg_export may write (deploy/export_folder.py): ``-o`` replaces only an earlier export, is
never inside nnU-Net's folders but at its default place, is checked before the export starts, and an export that
a kill left aside is put back. No model is exported here: the command is refused before it loads one."""
import errno
import json
import os
from pathlib import Path

import pytest
import torch
from bad_input_table import tree
from planted import KINDS, plant, snapshot
from tiny_export import description_of

from nnunetv2_meddisseg.deploy import export, export_folder
from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, fold_model_file, sha256_of
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import find_set_aside, set_aside, temporary_sibling

DATASET = "Dataset987_Tiny"
PROG = "nnUNetv2_meddisseg_export"


@pytest.fixture
def model(nnunet_dirs, monkeypatch) -> Path:
    """A trained model folder as nnU-Net lays it out (one fold, a checkpoint of plain tensors); the export may not
    start its work here (nnU-Net's predictor raises where it is built)."""
    folder = nnunet_dirs["nnUNet_results"] / DATASET / "nnUNetTrainer__nnUNetPlans__2d"
    (folder / "fold_0").mkdir(parents=True)
    torch.save({"network_weights": {"w": torch.zeros(2)}}, folder / "fold_0" / "checkpoint_final.pth")
    (folder / "plans.json").write_text("{}")

    def export_started(*args, **kwargs):
        raise AssertionError("the export's work started")

    import nnunetv2.inference.predict_from_raw_data as nnunet_prediction

    monkeypatch.setattr(nnunet_prediction, "nnUNetPredictor", export_started)
    return folder


def earlier_export(folder: Path) -> Path:
    """An export folder as the export writes it."""
    (folder / "fold_0").mkdir(parents=True)
    (folder / fold_model_file(0)).write_bytes(b"graph")
    (folder / DESCRIPTION_FILE).write_text(json.dumps(description_of({0: b"graph"})))
    return folder


def _refused(argv, capsys, root: Path) -> str:
    before = tree(root)
    code = export.main(["-d", DATASET, "-f", "0", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"{PROG}: error: "), err
    assert tree(root) == before  # nothing written, nothing removed
    return err


def _user_folder(tmp: Path, model: Path) -> str:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("mine")
    return str(tmp / "mine")


def _a_file(tmp: Path, model: Path) -> str:
    (tmp / "kvasir_onnx").write_text("a file")
    return str(tmp / "kvasir_onnx")


def _current_folder(tmp: Path, model: Path) -> str:
    _user_folder(tmp, model)
    os.chdir(tmp / "mine")
    return "."


def _another_description(tmp: Path, model: Path) -> str:
    (tmp / "other").mkdir()
    (tmp / "other" / DESCRIPTION_FILE).write_text('{"model": "someone else\'s"}')
    return str(tmp / "other")


def _without_marker(tmp: Path, model: Path) -> str:
    """An export folder whose description of format 1 lacks the ``written_by`` marker."""
    earlier_export(tmp / "unmarked")
    description = json.loads((tmp / "unmarked" / DESCRIPTION_FILE).read_text())
    description["format_version"] = 1
    del description["written_by"]
    (tmp / "unmarked" / DESCRIPTION_FILE).write_text(json.dumps(description))
    return str(tmp / "unmarked")


def _export_with_user_file(tmp: Path, model: Path) -> str:
    earlier_export(tmp / "kvasir_onnx")
    (tmp / "kvasir_onnx" / "notes.txt").write_text("mine")
    return str(tmp / "kvasir_onnx")


def _link_to_export(tmp: Path, model: Path) -> str:
    earlier_export(tmp / "kvasir_onnx")
    (tmp / "link").symlink_to(tmp / "kvasir_onnx")
    return str(tmp / "link")


@pytest.mark.parametrize("setup,message", [
    (_user_folder, "exists and is not an export of nnUNetv2_meddisseg_export"),
    (_a_file, "exists and is not a folder"),
    (lambda tmp, model: str(model), "is inside the model folder"),
    (_current_folder, "exists and is not an export of nnUNetv2_meddisseg_export"),
    (_another_description, "no onnx_model.json written by it"),
    (_without_marker, "no onnx_model.json written by it"),
    (_export_with_user_file, "also holds notes.txt, which the export did not write"),
    (_link_to_export, "is a symbolic link"),
], ids=["user folder", "file", "model folder", "-o .", "someone else's onnx_model.json", "no written_by marker",
        "export with a user file", "symbolic link"])
def test_existing_output_that_is_not_an_earlier_export_is_refused_first(setup, message, model, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    err = _refused(["-o", setup(work, model)], capsys, tmp_path)
    assert message in err, err


@pytest.mark.parametrize("where,message", [
    (lambda d, model: d["nnUNet_raw"] / DATASET / "onnx", "is inside nnUNet_raw"),
    (lambda d, model: d["nnUNet_preprocessed"] / "exports", "is inside nnUNet_preprocessed"),
    (lambda d, model: d["nnUNet_results"] / DATASET / "onnx", "is inside nnUNet_results"),
    (lambda d, model: model / "fold_0" / "onnx", "is inside the model folder"),
    (lambda d, model: d["nnUNet_results"].parent / "link_to_raw" / "onnx", "is inside nnUNet_raw"),
], ids=["raw", "preprocessed", "results", "model folder", "through a link"])
def test_output_inside_nnunet_folders_is_refused_but_the_default(where, message, model, nnunet_dirs, tmp_path,
                                                                  capsys):
    (nnunet_dirs["nnUNet_raw"] / DATASET).mkdir()
    (nnunet_dirs["nnUNet_results"].parent / "link_to_raw").symlink_to(nnunet_dirs["nnUNet_raw"])
    err = _refused(["-o", str(where(nnunet_dirs, model))], capsys, tmp_path)
    assert message in err, err
    # the default, onnx in the model folder, is the one place inside nnU-Net's folders
    assert export_folder.check_output(model / "onnx", model) == model / "onnx"
    earlier_export(model / "onnx")
    assert export_folder.check_output(model / "onnx", model) == model / "onnx"


@pytest.mark.parametrize("make", [
    lambda p: None, lambda p: p.mkdir(), earlier_export,
], ids=["new", "empty folder", "earlier export"])
def test_new_empty_or_earlier_export_is_accepted(make, model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "kvasir_onnx")
    assert export_folder.check_output(Path("kvasir_onnx"), model) == tmp_path / "kvasir_onnx"


def test_export_a_kill_left_aside_is_put_back_before_the_check(model, tmp_path, capsys):
    target = earlier_export(tmp_path / "kvasir_onnx")
    before = {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    # a kill between replace_folder's two renames: the old export aside, the new one complete but not in place
    set_aside(target)
    earlier_export(temporary_sibling(target, folder=True))
    assert export_folder.check_output(target, model) == target
    assert {p.relative_to(target): p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert find_set_aside(target) is None and not list(tmp_path.glob(".kvasir_onnx.*.old"))
    assert "put back the earlier export" in capsys.readouterr().out
    # the predictor names what a kill left aside
    from nnunetv2_meddisseg.deploy.description import read_description

    set_aside(target)
    with pytest.raises(UserError, match=r"an interrupted export left the previous one aside as .*/\.kvasir_onnx\."
                                        r"\w{8}\.old/kept: rerun the export"):
        read_description(target)


def test_a_hidden_folder_of_that_name_that_is_no_export_is_left_alone(model, tmp_path):
    aside = tmp_path / ".kvasir_onnx.old"
    aside.mkdir()
    (aside / "notes.txt").write_text("mine")
    assert export_folder.check_output(tmp_path / "kvasir_onnx", model) == tmp_path / "kvasir_onnx"
    assert not (tmp_path / "kvasir_onnx").exists() and (aside / "notes.txt").read_text() == "mine"


def test_unwritable_output_is_one_line(model, tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    err = _refused(["-o", str(tmp_path / "a_file" / "onnx")], capsys, tmp_path)
    assert f"cannot write {tmp_path / 'a_file' / 'onnx'}: {tmp_path / 'a_file'} is not a folder" in err

    def permission_denied(**kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", kwargs["dir"])

    monkeypatch.setattr(export_folder.tempfile, "mkdtemp", permission_denied)  # as on a folder of another user
    err = _refused(["-o", str(tmp_path / "read_only" / "onnx")], capsys, tmp_path)
    assert f"cannot write {tmp_path / 'read_only' / 'onnx'}: Permission denied" in err


def test_a_failed_write_leaves_the_earlier_export(tmp_path, monkeypatch):
    target = earlier_export(tmp_path / "kvasir_onnx")
    before = tree(tmp_path)
    real = Path.write_bytes

    def disk_full(self, data):
        real(self, data[:3])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(UserError, match=f"cannot write {target}: No space left on device"):
        export_folder.write_export(target, {"0": b"new graph"}, description_of({0: b"new graph"}))
    assert tree(tmp_path) == before and (target / fold_model_file(0)).read_bytes() == b"graph"


def test_an_export_with_reduced_precision_files_is_an_earlier_export(model, tmp_path):
    """What the export writes with --int8 (each fold's IR beside its graph) is accepted as an earlier export and
    replaced whole: an export without them leaves none behind."""
    target = tmp_path / "kvasir_onnx"
    ir = {"fold_0/model_int8.xml": b"<net/>", "fold_0/model_int8.bin": b"weights"}
    description = description_of({0: b"graph"})
    description["folds"][0]["precisions"] = {"int8": {"verified": True, "model": "fold_0/model_int8.xml",
                                                      "files": {name: sha256_of(data) for name, data in ir.items()}}}
    export_folder.write_export(target, {"0": b"graph"}, description, ir)
    assert {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()} == {
        DESCRIPTION_FILE, fold_model_file(0), *ir}
    assert export_folder.check_output(target, model) == target
    export_folder.write_export(target, {"0": b"graph 2"}, description_of({0: b"graph 2"}))
    assert {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()} == {
        DESCRIPTION_FILE, fold_model_file(0)}
    with pytest.raises(ValueError, match="outside the fold folders"):
        export_folder.write_export(target, {"0": b"graph"}, description_of({0: b"graph"}), {"model_int8.xml": b""})


@pytest.mark.parametrize("name", [".kvasir_onnx.partial", ".kvasir_onnx.old"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_or_link_of_a_fixed_temporary_name_is_left_alone(model, tmp_path, capsys, name, kind):
    """A user's folder, or a link to a folder outside (an earlier export, say), where the export's temporary or
    set-aside folder would be: the export replaces -o all the same, writes nothing through the link and leaves
    both as they were."""
    target = earlier_export(tmp_path / "kvasir_onnx")
    plant(tmp_path / name, kind, tmp_path / "outside")
    if kind == "link":
        earlier_export(tmp_path / "outside")
    before = snapshot(tmp_path, leave_out=[target])
    for graph in (b"new graph", b"newer graph"):  # into an earlier export, and into the one just written
        assert export_folder.check_output(target, model) == target
        export_folder.write_export(target, {"0": graph}, description_of({0: graph}))
        assert (target / fold_model_file(0)).read_bytes() == graph and not target.is_symlink()
        assert json.loads((target / DESCRIPTION_FILE).read_text()) == description_of({0: graph})
        assert snapshot(tmp_path, leave_out=[target]) == before  # untouched, and no temporary left
    assert "put back" not in capsys.readouterr().out


def test_an_output_whose_parent_folders_do_not_exist_yet_is_written(model, tmp_path):
    """``-o`` two folders below any existing one: the export makes them, as ``mkdir -p`` would."""
    output = export_folder.check_output(tmp_path / "exports" / "new" / "model", model)
    export_folder.write_export(output, {"0": b"graph"}, description_of({0: b"graph"}))
    assert (output / "fold_0" / "model.onnx").read_bytes() == b"graph"
    assert sorted(p.name for p in output.parent.iterdir()) == ["model"]  # no temporary left beside it
