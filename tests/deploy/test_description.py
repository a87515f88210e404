"""A model folder is checked before it is trusted (deploy/description.py): every field of onnx_model.json by type,
range and agreement with the others, fold files inside the folder, each graph against its recorded sha256 and each
loaded graph's shapes against the description; every refusal one line naming the file and the field. Through the
predictor (OnnxPredictor and its command) where a graph is involved."""
import copy
import json
import re
from pathlib import Path

import pytest
from tiny_export import description_of, export_tiny, tiny_graph, traced_graph, write_cases, write_description

from nnunetv2_meddisseg.deploy.description import (
    DESCRIPTION_FILE,
    GRAPH_FIELDS,
    GRAPH_FIELDS_KEY,
    bind_graph,
    check_graph_io,
    fold_model_file,
    graph_fields,
    read_description,
    read_fold_model,
    recorded_graph_fields,
    sha256_of,
    validate_description,
)
from nnunetv2_meddisseg.deploy.predict_onnx import PROG, OnnxPredictor, main
from nnunetv2_meddisseg.errors import UserError

GOOD = description_of({0: b"graph"})


def _with(**changes) -> dict:
    d = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is KeyError:
            del d[key]
        else:
            d[key] = value
    return d


def _regions(**changes) -> dict:
    return _with(**{"labels": {"background": 0, "whole": [1, 2], "core": 2}, "regions_class_order": [1, 2],
                    **changes})


FIGURES = {"cases": 2, "mean_dice_to_fp32": 0.995, "min_dice_to_fp32": 0.99, "pseudo_dice_fp32": 0.8,
           "pseudo_dice": 0.799, "pseudo_dice_drop_points": 0.1}
INT8 = {"verified": True, "model": "fold_0/model_int8.xml",
        "files": {"fold_0/model_int8.xml": "a" * 64, "fold_0/model_int8.bin": "b" * 64},
        "kept_in_fp32": ["/decoder"], "figures": FIGURES, "tried": []}
GUARD = {"bounds": {"min_dice_to_fp32": 0.99, "max_pseudo_dice_drop": 0.5}, "calibration_tiles": 16,
         "validation": "the fold's validation cases"}


def _precisions(guard=GUARD, **records) -> dict:
    """GOOD with fold 0's ``precisions`` and the guard's settings (``KeyError``: left out)."""
    d = _with()
    d["folds"][0]["precisions"] = records
    if guard is not KeyError:
        d["precision_guard"] = guard
    return d


CT = {"scheme": "CTNormalization", "use_mask_for_norm": False, "intensity_properties": {"mean": 1.0, "std": 2.0}}

BAD = {
    "patch size 0": (_with(patch_size=[0, 16]), "patch_size must be two integers from 1 to 4096"),
    "negative patch size": (_with(patch_size=[-16, 16]), "patch_size must be two integers"),
    "huge patch size": (_with(patch_size=[200000, 200000]), "patch_size must be two integers from 1 to 4096"),
    "float patch size": (_with(patch_size=[16.5, 16]), "patch_size must be two integers"),
    "3D patch size": (_with(patch_size=[16, 16, 16]), "patch_size must be two integers"),
    "patch size as text": (_with(patch_size="16x16"), "patch_size must be two integers"),
    "no input channels": (_with(num_input_channels=0), "num_input_channels must be an integer >= 1"),
    "heads as text": (_with(num_segmentation_heads="2"), "num_segmentation_heads must be an integer >= 1"),
    "heads that disagree with labels": (_with(num_segmentation_heads=3),
                                        "num_segmentation_heads must be the number of labels (2)"),
    "mirror axis beyond the image": (_with(mirror_axes=[0, 2]), "mirror_axes must be null or a list of distinct"),
    "mirror axis twice": (_with(mirror_axes=[1, 1]), "mirror_axes must be null or a list of distinct"),
    "negative mirror axis": (_with(mirror_axes=[-1]), "mirror_axes must be"),
    "transpose no permutation": (_with(transpose_forward=[0, 1, 1]), "transpose_forward must be a permutation"),
    "transpose moving the slice axis": (_with(transpose_forward=[1, 0, 2], transpose_backward=[1, 0, 2]),
                                        "keeps axis 0 first"),
    "backward transpose no inverse": (_with(transpose_forward=[0, 2, 1], transpose_backward=[0, 1, 2]),
                                      "transpose_backward must be the inverse of transpose_forward"),
    "labels as a list": (_with(labels=["background", "polyp"]), "labels must be an object of label names"),
    "background not 0": (_with(labels={"background": 1, "polyp": 0}), 'labels["background"] must be 0'),
    "labels not consecutive": (_with(labels={"background": 0, "polyp": 2}), "consecutive"),
    "label as text": (_with(labels={"background": 0, "polyp": "1"}), 'labels["polyp"] must be an integer'),
    "regions without their order": (_regions(regions_class_order=None), "regions_class_order must be a list of 2"),
    "region order of the wrong length": (_regions(regions_class_order=[1]), "regions_class_order must be a list of 2"),
    "order without regions": (_with(regions_class_order=[1]), "regions_class_order must be null"),
    "ignore label not the largest": (_with(labels={"background": 0, "ignore": 1, "polyp": 1}),
                                     'labels["ignore"] must be the largest label value'),
    "unknown normalisation": (_with(normalization=[{**GOOD["normalization"][0], "scheme": "MyNorm"}] * 3),
                              "normalization[0].scheme must be one of nnU-Net's schemes"),
    "normalisations fewer than channels": (_with(normalization=GOOD["normalization"][:2]),
                                           "normalization must be a list of 3 entries"),
    "CT normalisation without percentiles": (_with(normalization=[CT] * 3),
                                             "normalization[0].intensity_properties.percentile_00_5 must be a finite"),
    "mask flag as text": (_with(normalization=[{**GOOD["normalization"][0], "use_mask_for_norm": "no"}] * 3),
                          "normalization[0].use_mask_for_norm must be true or false"),
    "file ending of a volume": (_with(file_ending=".nii.gz"), "file_ending must be one of .png, .bmp, .tif"),
    "step size 0": (_with(tile_step_size=0), "tile_step_size must be a number in (0, 1]"),
    "step size above 1": (_with(tile_step_size=1.5), "tile_step_size must be a number in (0, 1]"),
    "step size below a pixel": (_with(tile_step_size=1e-9), "tile_step_size 1e-09 is below one pixel"),
    "no folds": (_with(folds=[]), "folds must be a non-empty list"),
    "fold without sha256": (_with(folds=[{"fold": "0", "file": fold_model_file(0)}]), "folds[0].sha256 is missing"),
    "fold twice": (_with(folds=GOOD["folds"] * 2), "folds must be a list of distinct folds"),
    "trainer as a number": (_with(trainer=3), "trainer must be a non-empty string"),
    "another writer": (_with(written_by="someone"), "written_by must be \"nnUNetv2_meddisseg_export\""),
    "format 1": (_with(format_version=1), "format version 1, this predictor reads 2: export the model again"),
    "missing field": (_with(mirror_axes=KeyError), "missing mirror_axes"),
    "not an object": ([1, 2], "expected a JSON object"),
    "unknown precision": (_precisions(fp16=INT8),
                          "folds[0].precisions must be an object with records of bf16 and int8"),
    "verified as text": (_precisions(int8={**INT8, "verified": "yes"}),
                         "folds[0].precisions.int8.verified must be true or false, got \"yes\""),
    "refused without a reason": (_precisions(int8={"verified": False}), "folds[0].precisions.int8.reason is missing"),
    "int8 as the fp32 graph": (_precisions(int8={**INT8, "model": fold_model_file(0)}),
                               "folds[0].precisions.int8.model must be an OpenVINO IR (.xml) listed in files with its "
                               ".bin, got"),
    "IR without its weights": (_precisions(int8={**INT8, "files": {"fold_0/model_int8.xml": "a" * 64}}),
                               "folds[0].precisions.int8.model must be an OpenVINO IR"),
    "file without sha256": (_precisions(int8={**INT8, "files": {**INT8["files"], "fold_0/model_int8.bin": "x"}}),
                            "folds[0].precisions.int8.files must be an object of paths in the model folder to their "
                            "sha256"),
    "kept blocks as text": (_precisions(int8={**INT8, "kept_in_fp32": "/encoder"}),
                            "folds[0].precisions.int8.kept_in_fp32 must be a list of block names"),
    "no figures": (_precisions(int8={k: v for k, v in INT8.items() if k != "figures"}),
                   "folds[0].precisions.int8.figures is missing"),
    "Dice above 1": (_precisions(int8={**INT8, "figures": {**FIGURES, "mean_dice_to_fp32": 1.5}}),
                     "folds[0].precisions.int8.figures.mean_dice_to_fp32 must be a number from 0 to 1"),
    "drop not a number": (_precisions(int8={**INT8, "figures": {**FIGURES, "pseudo_dice_drop_points": None}}),
                          "folds[0].precisions.int8.figures.pseudo_dice_drop_points must be a finite number"),
    "bf16 floats in a bf16 record": (_precisions(bf16={**INT8, "floats_in_bf16": {"verified": True,
                                                                                   "figures": FIGURES}}),
                                     "folds[0].precisions.bf16.floats_in_bf16 must be absent (an int8 record's "
                                     "verification of its floats in bf16)"),
    "bf16 floats verified without figures": (_precisions(int8={**INT8, "floats_in_bf16": {"verified": True}}),
                                             "folds[0].precisions.int8.floats_in_bf16.figures is missing"),
    "bf16 floats refused without a reason": (_precisions(int8={**INT8, "floats_in_bf16": {"verified": False}}),
                                             "folds[0].precisions.int8.floats_in_bf16.reason is missing"),
    "precisions without the guard": (_precisions(guard=KeyError, int8=INT8), "precision_guard is missing"),
    "guard bound out of range": (_precisions(guard={**GUARD, "bounds": {**GUARD["bounds"], "min_dice_to_fp32": 2}},
                                             int8=INT8),
                                 "precision_guard.bounds.min_dice_to_fp32 must be a number in (0, 1]"),
    "no calibration tiles": (_precisions(guard={**GUARD, "calibration_tiles": 0}, int8=INT8),
                             "precision_guard.calibration_tiles must be an integer >= 1"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_wrong_fields_are_one_line_naming_the_field(name):
    description, message = BAD[name]
    with pytest.raises(UserError) as e:
        validate_description(description, Path("m") / DESCRIPTION_FILE)
    text = str(e.value)
    assert text.startswith(f"{Path('m') / DESCRIPTION_FILE}: ") and "\n" not in text and message in text, text


def test_valid_descriptions_pass():
    for description in (GOOD, _regions(num_segmentation_heads=2), _with(mirror_axes=None),
                        _with(labels={"background": 0, "polyp": 1, "ignore": 2}), _with(tile_step_size=1),
                        _with(transpose_forward=[0, 2, 1], transpose_backward=[0, 2, 1]),
                        _precisions(int8=INT8, bf16={"verified": False, "reason": "no native bf16"}),
                        _precisions(int8={**INT8, "floats_in_bf16": {"verified": True, "figures": FIGURES}}),
                        _precisions(int8={**INT8, "floats_in_bf16": {"verified": False, "reason": "no native bf16"}}),
                        _precisions(bf16={**INT8, "model": fold_model_file(0), "files": {}})):
        assert validate_description(description, Path("m")) is description


def test_huge_patch_size_is_refused_before_any_allocation(tmp_path):
    # a 200000 x 200000 patch would pad every image to 3 x 4e10 float32 (480 GB) before the first tile
    export_tiny(tmp_path / "model", folds=(0,))
    description = json.loads((tmp_path / "model" / DESCRIPTION_FILE).read_text())
    description["patch_size"] = [200000, 200000]
    write_description(tmp_path / "model", description)
    write_cases(tmp_path / "in")
    assert main(["-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "model")]) == 2
    assert not (tmp_path / "out").exists()


def _escaping(tmp: Path, how: str) -> None:
    """Fold 0 of the export in ``tmp / "model"`` pointing outside the folder."""
    outside = tmp / "elsewhere"
    outside.mkdir()
    graph = (tmp / "model" / fold_model_file(0)).read_bytes()
    (outside / "model.onnx").write_bytes(graph)
    description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
    if how == "..":
        description["folds"][0]["file"] = "../elsewhere/model.onnx"
    elif how == "absolute":
        description["folds"][0]["file"] = str(outside / "model.onnx")
    else:  # a symbolic link inside the folder that leads out of it
        (tmp / "model" / fold_model_file(0)).unlink()
        (tmp / "model" / fold_model_file(0)).symlink_to(outside / "model.onnx")
    write_description(tmp / "model", description)


@pytest.mark.parametrize("how,message", [("..", "must be a path inside the model folder, without '..'"),
                                         ("absolute", "must be a path inside the model folder"),
                                         ("link", "leads out of the model folder")])
def test_fold_files_stay_inside_the_model_folder(tmp_path, how, message):
    export_tiny(tmp_path / "model", folds=(0,))
    _escaping(tmp_path, how)
    with pytest.raises(UserError, match=re.escape(message)):
        read_description(tmp_path / "model")


def _replace_graph(model: Path, graph: bytes, record: bool) -> None:
    """Fold 0's graph replaced by ``graph``; ``record``: its sha256 recorded too (a description edited with it)."""
    (model / fold_model_file(0)).write_bytes(graph)
    if record:
        description = json.loads((model / DESCRIPTION_FILE).read_text())
        description["folds"][0]["sha256"] = sha256_of(graph)
        write_description(model, description)


@pytest.mark.parametrize("graph,record,message", [
    (lambda: tiny_graph(7), False, "is not the"),  # another network of the same shapes
    (lambda: b"", False, "empty (0 bytes)"),
    (lambda: tiny_graph(0)[:200], False, "is not the"),  # truncated
    (lambda: tiny_graph(0)[:200], True, "model.onnx: not an ONNX graph (a field runs past the end)"),
    (lambda: b"\x00" * 64, True, "model.onnx: not an ONNX graph (a field numbered 0)"),
    (lambda: tiny_graph(0).replace(b"Tanh", b"Tanx"), True, "{runtime} cannot load it"),
    (lambda: traced_graph(0), True, "model.onnx: carries no record of the fields it was exported and checked"),
    (lambda: tiny_graph(0, out_channels=3), True, "has 3 segmentation heads, onnx_model.json says 2"),
    (lambda: tiny_graph(0, out_channels=1), True, "has 1 segmentation heads, onnx_model.json says 2"),
    (lambda: tiny_graph(0, in_channels=1), True, "has 1 input channels, onnx_model.json says 3"),
], ids=["other network", "empty", "truncated", "truncated, sha256 recorded", "garbage, sha256 recorded",
        "unknown operator, sha256 recorded", "without the description's fields, sha256 recorded", "3 classes",
        "1 class", "1 input channel"])
@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_graph_that_is_not_the_exported_one_is_refused_in_one_line(tmp_path, capsys, graph, record, message, runtime):
    export_tiny(tmp_path / "model", folds=(0,))
    write_cases(tmp_path / "in")
    _replace_graph(tmp_path / "model", graph(), record)
    assert main(["-i", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "-m", str(tmp_path / "model"),
                 "--runtime", runtime]) == 2
    err = capsys.readouterr().err
    message = message.format(runtime={"openvino": "OpenVINO", "onnxruntime": "ONNX Runtime"}[runtime])
    assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: ") and message in err, err
    assert str(tmp_path / "model" / fold_model_file(0)) in err
    assert not (tmp_path / "out").exists()


def test_the_graph_fields_are_read_as_the_export_writes_them(tmp_path):
    """bind_graph writes the description's GRAPH_FIELDS into the graph's metadata as onnx and ONNX Runtime read it,
    keeping other entries and replacing its own; the predictor's reader (neither onnx nor a runtime) reads them back,
    also from the IR OpenVINO saves from the graph, and refuses what is no graph in one line."""
    import onnx
    import onnxruntime
    import openvino as ov

    d = description_of({})
    fields = graph_fields(d)
    assert json.loads(fields) == {key: d[key] for key in GRAPH_FIELDS}
    graph = tiny_graph(0)
    assert recorded_graph_fields(graph, "model.onnx") == [fields]
    session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map == {GRAPH_FIELDS_KEY: fields}
    proto = onnx.load_from_string(graph)
    onnx.helper.set_model_props(proto, {"author": "someone", GRAPH_FIELDS_KEY: "an older record"})
    other = {**d, "patch_size": [32, 32]}
    rebound = bind_graph(proto.SerializeToString(), other)
    assert {(e.key, e.value) for e in onnx.load_from_string(rebound).metadata_props} == {
        ("author", "someone"), (GRAPH_FIELDS_KEY, graph_fields(other))}
    assert recorded_graph_fields(rebound, "model.onnx") == [graph_fields(other)]
    assert recorded_graph_fields(traced_graph(0), "model.onnx") == []
    ov.save_model(ov.Core().read_model(graph), str(tmp_path / "model.xml"), compress_to_fp16=False)
    assert recorded_graph_fields((tmp_path / "model.xml").read_bytes(), "model.xml") == [fields]
    for data, name, message in [(b"<net><layers>", "m.xml", "not an OpenVINO IR (no element found"),
                                (graph[:-3], "m.onnx", "not an ONNX graph (a field runs past the end)")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            recorded_graph_fields(data, name)


def test_many_edited_fields_are_one_line(tmp_path):
    description = export_tiny(tmp_path / "model", folds=(0,))
    edited = {**description, "patch_size": [32, 32], "file_ending": ".bmp", "mirror_axes": None,
              "tile_step_size": 1, "labels": {"background": 0, "tumour": 1}}
    with pytest.raises(UserError) as e:
        read_fold_model(tmp_path / "model", description["folds"][0], edited)
    assert str(e.value) == (
        f"{tmp_path / 'model' / DESCRIPTION_FILE}: patch_size [32, 32], file_ending \".bmp\", labels "
        f"{{\"background\": 0, \"tumour\": 1}} (and 2 more) are not what fold_0/model.onnx was exported and "
        f"checked with ([16, 16], \".png\", {{\"background\": 0, \"polyp\": 1}}): the description was edited; "
        f"export again")
    assert read_fold_model(tmp_path / "model", description["folds"][0], description)  # as exported


def test_graph_shapes_against_the_description():
    d = GOOD
    check_graph_io(["b", 3, "h", "w"], [None, 2, None, None], d, "g")
    check_graph_io(["b", 3, 16, 16], ["b", 2, 16, 16], d, "g")  # fixed at the patch size: tiles are patches
    check_graph_io(["b", "c", "h", "w"], ["b", "k", "h", "w"], d, "g")  # symbolic: checked at the first tile
    for shapes, message in [((["b", 3, "h", "w"], ["b", 3, "h", "w"]), "output has 3 segmentation heads"),
                            ((["b", 1, "h", "w"], ["b", 2, "h", "w"]), "input has 1 input channels"),
                            ((["b", 3, "h", "w"], ["b", 2, "h"]), "output has shape"),
                            (([1, 3, "h", "w"], ["b", 2, "h", "w"]), "fixed batch of 1"),
                            ((["b", 3, 32, "w"], ["b", 2, "h", "w"]), "fixed height of 32, the patch is [16, 16]"),
                            ((None, ["b", 2, "h", "w"]), "input has shape null")]:
        with pytest.raises(UserError, match=re.escape(message)):
            check_graph_io(*shapes, d, "g")


def test_a_graph_with_a_symbolic_class_axis_is_checked_at_its_first_tile(tmp_path, monkeypatch):
    """Where the session reports no class count, the first tile's logits are checked (numpy would broadcast one
    class over the description's two and write all-background masks)."""
    import onnxruntime

    export_tiny(tmp_path / "model", folds=(0,))
    write_cases(tmp_path / "in")
    _replace_graph(tmp_path / "model", tiny_graph(0, out_channels=1), record=True)
    real = onnxruntime.InferenceSession

    class SymbolicOutput:
        def __init__(self, *args, **kwargs):
            self.session = real(*args, **kwargs)

        def get_outputs(self):
            output = self.session.get_outputs()[0]
            return [type("Output", (), {"name": output.name, "shape": ["b", "k", "h", "w"]})()]

        def __getattr__(self, name):
            return getattr(self.session, name)

    monkeypatch.setattr(onnxruntime, "InferenceSession", SymbolicOutput)
    predictor = OnnxPredictor(tmp_path / "model", runtime="onnxruntime")
    with pytest.raises(UserError, match=r"returned logits of shape \(4, 1, 16, 16\) .* expected \(4, 2, 16, 16\)"):
        predictor.predict_files([tmp_path / "in" / "case0_0000.png"])


def test_model_folder_without_permission_to_read_is_one_line(tmp_path, monkeypatch):
    export_tiny(tmp_path / "model", folds=(0,))
    real = Path.read_bytes

    def denied(self):
        if self.name == "model.onnx":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(UserError, match="model.onnx: cannot read it \\(Permission denied\\)"):
        OnnxPredictor(tmp_path / "model")
