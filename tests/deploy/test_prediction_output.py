"""What nnUNetv2_meddisseg_predict_onnx writes (deploy/prediction_output.py, deploy/predict_onnx.py): never into its
inputs, over existing files only where they are its own unchanged outputs (or with --overwrite); nnU-Net's
conventions for large jobs (-num_parts / -part_id as nnUNetv2_predict splits the cases, --continue_prediction, a
progress bar) and the next case preprocessed while this one is predicted, with the sequential path's results."""
import itertools
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from bad_input_table import tree
from PIL import Image
from planted import KINDS, plant, snapshot
from tiny_export import export_tiny, write_cases

from nnunetv2_meddisseg.deploy import prediction_output
from nnunetv2_meddisseg.deploy.predict_onnx import PROG, OnnxPredictor, cases_of_part, find_cases, main
from nnunetv2_meddisseg.deploy.prediction_output import RECORD_FOLDER
from nnunetv2_meddisseg.errors import UserError


@pytest.fixture
def work(tmp_path) -> Path:
    export_tiny(tmp_path / "model")
    write_cases(tmp_path / "in")
    return tmp_path


def _argv(work: Path, output, *extra) -> list:
    return ["-i", str(work / "in"), "-o", str(output), "-m", str(work / "model"), "--threads", "1", *extra]


def _refused(argv, capsys, root: Path) -> str:
    before = tree(root)
    inputs = {p: p.read_bytes() for p in (root / "in").iterdir()}
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"{PROG}: error: "), err
    assert tree(root) == before and {p: p.read_bytes() for p in (root / "in").iterdir()} == inputs
    return err


def _bytes(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("output,message", [
    (lambda w: w / "in", "is the input folder -i"),
    (lambda w: Path("in"), "is the input folder -i"),  # relative, from the working folder
    (lambda w: w / "in" / ".." / "in", "is the input folder -i"),
    (lambda w: w / "link_to_in", "is the input folder -i"),  # a symbolic link to it
    (lambda w: w / "in" / "predictions", "is inside the input folder -i"),
    (lambda w: w / "model", "is the model folder -m"),
    (lambda w: w / "model" / "fold_0", "is inside the model folder -m"),
], ids=["same", "relative", "dotdot", "link", "inside input", "model", "inside model"])
def test_output_folder_that_is_an_input_is_refused(work, capsys, monkeypatch, output, message):
    monkeypatch.chdir(work)
    (work / "link_to_in").symlink_to(work / "in")
    err = _refused(_argv(work, output(work)), capsys, work)
    assert message in err and "never writes into its inputs" in err, err


@pytest.mark.parametrize("link,case,flags", [
    ("symlink", "case0", []), ("hardlink", "case1", []), ("symlink", "case2", ["--save_probabilities"]),
], ids=["mask symlinked to an input", "mask hard-linked to an input", "probabilities symlinked to an input"])
def test_output_file_that_is_an_input_file_is_refused_naming_both(work, capsys, link, case, flags):
    (work / "out").mkdir()
    source = work / "in" / f"{case}_0000.png"
    target = work / "out" / (f"{case}.npz" if flags else f"{case}.png")
    target.symlink_to(source) if link == "symlink" else os.link(source, target)
    err = _refused(_argv(work, work / "out", *flags), capsys, work)
    assert f"{target} (the output of case {case}) would overwrite the input file {source}" in err, err


def test_existing_outputs_are_replaced_only_when_they_are_ours(work, capsys):
    out = work / "out"
    out.mkdir()
    (out / "case1.png").write_bytes(b"a user's mask")
    err = _refused(_argv(work, out), capsys, work)
    assert f"{out / 'case1.png'} exists and was not written by {PROG}" in err and "--overwrite" in err
    assert main(_argv(work, out, "--overwrite")) == 0  # the explicit flag replaces it
    first = _bytes(out)
    assert first["case1.png"] != b"a user's mask" and sorted(first) == ["case0.png", "case1.png", "case2.png"]
    assert sorted(p.name for p in (out / RECORD_FOLDER).iterdir()) == ["case0.json", "case1.json", "case2.json"]
    assert main(_argv(work, out)) == 0 and _bytes(out) == first  # our own outputs are replaced without a flag
    # probabilities written by one run stay ours through a run without them
    assert main(_argv(work, out, "--save_probabilities")) == 0 and main(_argv(work, out)) == 0
    assert main(_argv(work, out, "--save_probabilities")) == 0
    # a mask corrected by hand after it was written is no longer ours; nor is a user's probabilities file
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(out / "case0.png")
    (out / "case2.npz").write_bytes(b"a user's file")
    capsys.readouterr()
    err = _refused(_argv(work, out, "--save_probabilities"), capsys, work)
    assert f"{out / 'case0.png'} (and 1 more) exists and was not written by {PROG} (or was changed since)" in err
    assert main(_argv(work, out, "--save_probabilities", "--overwrite")) == 0


def test_continue_prediction_skips_what_was_written_and_redoes_what_a_kill_cut_short(work, capsys, monkeypatch):
    out = work / "out"
    predictor = OnnxPredictor(work / "model", threads=1)
    real_write = prediction_output.write_segmentation

    def killed_at_case2(segmentation, path):
        if path.name == "case2.png":
            raise KeyboardInterrupt  # the process stops after case 2's record and probabilities were written
        real_write(segmentation, path)

    monkeypatch.setattr(prediction_output, "write_segmentation", killed_at_case2)
    with pytest.raises(KeyboardInterrupt):
        predictor.predict_folder(work / "in", out, save_probabilities=True)
    monkeypatch.setattr(prediction_output, "write_segmentation", real_write)
    assert sorted(_bytes(out)) == ["case0.npz", "case0.png", "case1.npz", "case1.png", "case2.npz"]
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file()}
    written = predictor.predict_folder(work / "in", out, save_probabilities=True, continue_prediction=True)
    assert written == [out / "case2.png"]  # case 2's own partial outputs are replaced without --overwrite
    assert {n: out.joinpath(n).stat().st_mtime_ns for n in ("case0.png", "case0.npz", "case1.png")} == \
        {n: stamps[n] for n in ("case0.png", "case0.npz", "case1.png")}  # the whole cases are left as they were
    (out / "case0.png").unlink()
    assert predictor.predict_folder(work / "in", out, save_probabilities=True, continue_prediction=True) == \
        [out / "case0.png"]
    assert capsys.readouterr().out.count("--continue_prediction: 2 case(s) already predicted, 1 to go") == 2
    fresh = work / "fresh"
    predictor.predict_folder(work / "in", fresh, save_probabilities=True)
    assert {n: b for n, b in _bytes(out).items() if n.endswith(".png")} == \
        {n: b for n, b in _bytes(fresh).items() if n.endswith(".png")}


NAMES = ["a", "a-b", "a_b", "B", "case10", "case2", "z", "x.y", "a_0000", "Case1", "c"]


@pytest.mark.parametrize("num_parts", [1, 2, 3, 4, 11, 13])
def test_parts_cover_every_case_exactly_once_as_nnunet_splits_them(tmp_path, num_parts):
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    folder = tmp_path / "in"
    folder.mkdir()
    for name in NAMES:
        (folder / f"{name}_0000.png").write_bytes(b"")  # names only: nothing is read
    cases = list(find_cases(folder, ".png"))
    lists = create_lists_from_splitted_dataset_folder(str(folder), ".png", num_processes=1)
    nnunet = nnUNetPredictor.__new__(nnUNetPredictor)
    nnunet.dataset_json = {"file_ending": ".png"}
    covered = []
    for part_id in range(num_parts):
        ours = cases_of_part(cases, num_parts, part_id)
        theirs, _, _ = nnunet._manage_input_and_output_lists(lists, str(tmp_path / "out"), part_id=part_id,
                                                             num_parts=num_parts)
        assert ours == [Path(files[0]).name[:-len("_0000.png")] for files in theirs]
        covered += ours
    assert sorted(covered) == sorted(NAMES) and len(covered) == len(NAMES)


def test_parts_share_one_output_folder(work):
    """Three parts predicting into one folder at the same time: every case written once, every record there, the
    masks those of one whole run."""
    write_cases(work / "in", names=[f"case{i}" for i in range(7)], seed=1)
    out, whole = work / "out", work / "whole"
    predictors = [OnnxPredictor(work / "model", threads=1) for _ in range(3)]
    results, errors = {}, []

    def part(k):
        try:
            results[k] = predictors[k].predict_folder(work / "in", out, num_parts=3, part_id=k)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=part, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    names = [p.name for k in range(3) for p in results[k]]
    assert sorted(names) == [f"case{i}.png" for i in range(7)]
    assert sorted(p.name for p in (out / RECORD_FOLDER).iterdir()) == [f"case{i}.json" for i in range(7)]
    predictors[0].predict_folder(work / "in", whole)
    assert _bytes(out) == _bytes(whole)
    assert predictors[0].predict_folder(work / "in", out, continue_prediction=True) == []  # every record whole


@pytest.mark.parametrize("flags,message", [
    (["-num_parts", "0"], "-num_parts must be at least 1, got 0"),
    (["-num_parts", "2", "-part_id", "2"], "-part_id must be from 0 to 1 (-num_parts 2; parts count from 0), got 2"),
    (["-part_id", "-1"], "-part_id must be from 0 to 0"),
])
def test_bad_parts_are_one_line(work, capsys, flags, message):
    assert message in _refused(_argv(work, work / "out", *flags), capsys, work)


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "sequential"])
def test_preprocessing_ahead_overlaps_and_gives_the_sequential_results_in_order(work, ahead):
    write_cases(work / "in", names=[f"case{i}" for i in range(5)], seed=2)
    predictor = OnnxPredictor(work / "model", threads=1)
    cases = list(find_cases(work / "in", ".png"))
    started = [threading.Event() for _ in cases]
    log, overlapped, calls = [], [], itertools.count()
    real_prepare, real_logits = predictor.prepare, predictor.logits

    def prepare(files):
        i = cases.index(files[0].name[:-len("_0000.png")])
        started[i].set()
        log.append(("prepare", i, threading.current_thread() is threading.main_thread()))
        return real_prepare(files)

    def logits(data, progress=None):
        i = next(calls)
        # case i's prediction waits (up to 30 s) for case i + 1's preprocessing to start, where it runs ahead
        overlapped.append(i + 1 < len(cases) and started[i + 1].wait(30 if ahead else 0))
        log.append(("logits", i))
        return real_logits(data, progress)

    predictor.prepare, predictor.logits = prepare, logits
    written = predictor.predict_folder(work / "in", work / "out", save_probabilities=True, preprocess_ahead=ahead)
    assert written == [work / "out" / f"{c}.png" for c in cases]
    assert [e[1] for e in log if e[0] == "logits"] == list(range(len(cases)))
    assert overlapped == [ahead] * (len(cases) - 1) + [False]
    assert {entry[2] for entry in log if entry[0] == "prepare"} == {not ahead}
    predictor.prepare, predictor.logits = real_prepare, real_logits
    predictor.predict_folder(work / "in", work / "reference", save_probabilities=True, preprocess_ahead=False)
    ours, reference = _bytes(work / "out"), _bytes(work / "reference")
    assert sorted(ours) == sorted(reference) and len(ours) == 2 * len(cases)
    for name in ours:
        if name.endswith(".png"):
            assert ours[name] == reference[name]
        else:
            a, b = np.load(work / "out" / name), np.load(work / "reference" / name)
            assert np.array_equal(a["probabilities"], b["probabilities"])


def test_an_error_in_a_case_preprocessed_ahead_comes_at_its_turn(work):
    (work / "in" / "case1_0000.png").write_bytes(b"not an image")
    predictor = OnnxPredictor(work / "model", threads=1)
    with pytest.raises(UserError, match="case1_0000.png: cannot read the image"):
        predictor.predict_folder(work / "in", work / "out")
    assert sorted(p.name for p in (work / "out").iterdir() if p.is_file()) == ["case0.png"]  # case 0 came first


def test_progress_bar_on_request_only(work, capsys):
    predictor = OnnxPredictor(work / "model", threads=1)
    predictor.predict_folder(work / "in", work / "out", progress=True)
    assert "3/3" in capsys.readouterr().err
    assert main(_argv(work, work / "out2")) == 0  # stderr is no terminal here: no bar
    assert main(_argv(work, work / "out3", "--disable_progress_bar")) == 0
    assert capsys.readouterr().err == ""


def test_no_bar_where_tqdm_is_not_installed(work, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # importing tqdm fails, as where it is not installed
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(_argv(work, work / "out")) == 0
    assert sorted(p.name for p in (work / "out").iterdir() if p.is_file()) == ["case0.png", "case1.png", "case2.png"]
    assert capsys.readouterr().err == ""


def test_unwritable_output_folder_is_one_line(work, capsys, monkeypatch):
    import errno

    (work / "a_file").write_text("x")
    err = _refused(_argv(work, work / "a_file" / "out"), capsys, work)
    assert f"cannot write {work / 'a_file' / 'out'}" in err, err
    real = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name == RECORD_FOLDER:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(_argv(work, work / "out")) == 2
    assert f"cannot write {work / 'out'}: Read-only file system" in capsys.readouterr().err


@pytest.mark.parametrize("name", [".case0.png.partial", ".case0.npz.partial", f"{RECORD_FOLDER}/.case0.json.partial",
                                  f"{RECORD_FOLDER}/notes"], ids=["mask", "probabilities", "record", "record folder"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_or_link_of_a_fixed_temporary_name_is_left_alone(work, capsys, name, kind):
    """A user's folder, or a link to a file outside -o, where a temporary file of the predictor would be (or in a
    record folder the user made): the predictor writes its files all the same, nothing through the link, and leaves
    both as they were."""
    out = work / "out"
    (out / RECORD_FOLDER).mkdir(parents=True)
    plant(out / name, kind, work / "outside" / "mask.png", file=True)
    before, planted = snapshot(work, leave_out=[out]), snapshot(out)
    assert main(_argv(work, out, "--save_probabilities")) == 0
    assert snapshot(work, leave_out=[out]) == before  # nothing written outside -o
    after = snapshot(out)
    assert {key: after[key] for key in planted} == planted
    assert sorted(set(after) - set(planted)) == sorted(
        [f"case{i}.{ending}" for i in range(3) for ending in ("npz", "png")]
        + [f"{RECORD_FOLDER}/case{i}.json" for i in range(3)])  # and no temporary left behind
    assert not (out / RECORD_FOLDER / "case0.json").is_symlink()
