"""The ONNX predictor's rows of the bad-input table (harness and contract in tests/bad_input_table.py): a tiny
export and input folder (tests/deploy/tiny_export.py) broken one way per row, through
``nnUNetv2_meddisseg_predict_onnx``'s ``main``: outputs that would overwrite an input or a file the predictor did
not write, model folders that disagree with themselves or with their graphs (among them each field the graphs
hold, edited in the description alone: ``deploy.description.GRAPH_FIELDS``), parts out of range, an image nnU-Net's
reader refuses, a float image with a NaN or infinite pixel, an output folder that cannot be made."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

import numpy as np
import pytest
from bad_input_table import Row, check_row
from PIL import Image
from tiny_export import (
    CASE_SHAPES,
    description_of,
    export_tiny,
    tiny_graph,
    traced_graph,
    write_cases,
    write_description,
)

from nnunetv2_meddisseg.deploy.description import DESCRIPTION_FILE, GRAPH_FIELDS, fold_model_file, sha256_of
from nnunetv2_meddisseg.deploy.prediction_output import RECORD_FOLDER

#: the fields of a regions model and of one with CT normalisation on its first channel, as a tiny export holds them
REGIONS = {"labels": {"background": 0, "whole": [1, 2], "core": 2}, "regions_class_order": [1, 2]}
CT = {"normalization": [{"scheme": "CTNormalization", "use_mask_for_norm": False,
                         "intensity_properties": {"mean": 10.0, "std": 2.0, "percentile_00_5": 0.0,
                                                  "percentile_99_5": 200.0}}]
      + description_of({})["normalization"][1:]}


def _model_and_cases(tmp: Path, **fields) -> List[str]:
    export_tiny(tmp / "model", folds=(0,), **fields)
    write_cases(tmp / "in")
    return ["-i", str(tmp / "in"), "-o", str(tmp / "out"), "-m", str(tmp / "model"), "--threads", "1"]


def _with_output(argv: List[str], output: Path) -> List[str]:
    argv = list(argv)
    argv[argv.index("-o") + 1] = str(output)
    return argv


def pred_output_is_input(tmp, env):
    return _with_output(_model_and_cases(tmp), tmp / "in")


def pred_output_links_to_input(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "predictions").symlink_to(tmp / "in")
    return _with_output(argv, tmp / "predictions")


def pred_output_file_is_an_input(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "case1.png").symlink_to(tmp / "in" / "case1_0000.png")
    return argv


def pred_output_not_ours(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "case2.png").write_bytes(b"a mask drawn by hand")
    return argv


def pred_records_folder_a_link(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "out").mkdir()
    (tmp / "elsewhere").mkdir()
    (tmp / "elsewhere" / "notes.txt").write_text("a user's notes")
    (tmp / "out" / RECORD_FOLDER).symlink_to(tmp / "elsewhere")
    return argv


def pred_records_folder_a_file(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / RECORD_FOLDER).write_text("a user's file")
    return argv


def pred_field(field: str, value):
    def setup(tmp, env):
        argv = _model_and_cases(tmp)
        description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
        description[field] = value
        write_description(tmp / "model", description)
        return argv
    return setup


def pred_edited(edit, **fields):
    """A tiny export (``fields`` replacing the tiny description's) whose description is then edited by
    ``edit(description)``: still a valid description, but not the one its graph was exported with."""
    def setup(tmp, env):
        argv = _model_and_cases(tmp, **fields)
        description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
        edit(description)
        write_description(tmp / "model", description)
        return argv
    return setup


def _set(**changes):
    return lambda description: description.update(changes)


def _set_normalization(channel: int, **changes):
    return lambda description: description["normalization"][channel].update(changes)


def pred_rebound_graph(tmp, env):
    """The graph written again with an edited patch size in its metadata, its sha256 left as recorded."""
    argv = _model_and_cases(tmp)
    description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
    (tmp / "model" / fold_model_file(0)).write_bytes(tiny_graph(0, description={**description,
                                                                               "patch_size": [32, 32]}))
    description["patch_size"] = [32, 32]
    write_description(tmp / "model", description)
    return argv


def pred_as_exported(**fields):
    return lambda tmp, env: _model_and_cases(tmp, **fields)


def pred_masks_written(tmp, env):
    assert sorted(p.name for p in (tmp / "out").glob("*.png")) == ["case0.png", "case1.png", "case2.png"]


def pred_fold_file_outside(tmp, env):
    argv = _model_and_cases(tmp)
    description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
    description["folds"][0]["file"] = "../in/model.onnx"
    write_description(tmp / "model", description)
    return argv


def pred_graph(graph, record: bool):
    def setup(tmp, env):
        argv = _model_and_cases(tmp)
        data = graph()
        (tmp / "model" / fold_model_file(0)).write_bytes(data)
        if record:
            description = json.loads((tmp / "model" / DESCRIPTION_FILE).read_text())
            description["folds"][0]["sha256"] = sha256_of(data)
            write_description(tmp / "model", description)
        return argv
    return setup


def unknown_operator() -> bytes:
    """The tiny graph (its fields in its metadata) with an operator no runtime knows."""
    return tiny_graph(0).replace(b"Tanh", b"Tanx")


def pred_parts(*flags: str):
    def setup(tmp, env):
        return [*_model_and_cases(tmp), *flags]
    return setup


def pred_grey_with_alpha(tmp, env):
    argv = _model_and_cases(tmp)
    Image.fromarray(np.zeros((8, 8, 2), np.uint8), mode="LA").save(tmp / "in" / "case0_0000.png")
    return argv


def pred_float_tiff(planted: float = None):
    """Every case a float32 RGB TIFF (the description's file ending .tif); case0 with ``planted`` in one pixel of
    its green channel, the first case predicted (so that the refusal comes before any output)."""
    def setup(tmp, env):
        import tifffile

        argv = _model_and_cases(tmp, file_ending=".tif")
        for png in sorted((tmp / "in").glob("*.png")):
            image = np.asarray(Image.open(png)).astype(np.float32) / 255
            if png.name == "case0_0000.png" and planted is not None:
                image[3, 5, 1] = planted
            tifffile.imwrite(png.with_suffix(".tif"), image, photometric="rgb")
            png.unlink()
        return argv
    return setup


def pred_float_tiff_check(tmp, env):
    import tifffile

    for case, shape in zip(("case0", "case1", "case2"), CASE_SHAPES):
        mask = tifffile.imread(tmp / "out" / f"{case}.tif")
        assert mask.shape == shape and set(np.unique(mask)) <= {0, 1}


def pred_output_under_a_file(tmp, env):
    argv = _model_and_cases(tmp)
    (tmp / "a_file").write_text("x")
    return _with_output(argv, tmp / "a_file" / "out")


def pred_palette_image(tmp, env):
    """A palette PNG (3 channels, as nnU-Net reads it) predicted like its RGB copy."""
    argv = _model_and_cases(tmp)
    rgb = np.asarray(Image.open(tmp / "in" / "case0_0000.png"))
    Image.fromarray(rgb).quantize(16).save(tmp / "in" / "case0_0000.png")
    return argv


def pred_palette_check(tmp, env):
    mask = np.asarray(Image.open(tmp / "out" / "case0.png"))
    assert mask.shape == (16, 16) and set(np.unique(mask)) <= {0, 1}


#: each field the graphs hold (GRAPH_FIELDS) edited in the description alone, or with the fields it must agree
#: with for the description to stay valid: (field, edit, the export's fields, the refusal after "onnx_model.json: ")
_EDITS = [
    ("patch_size", _set(patch_size=[32, 32]), {}, "patch_size [32, 32] is not what fold_0/model.onnx was exported "
                                                  "and checked with ([16, 16]): the description was edited; export "
                                                  "again"),
    ("num_input_channels", _set(num_input_channels=1, normalization=description_of({})["normalization"][:1]), {},
     'num_input_channels 1, normalization [{"scheme": "ZScoreNormalization", "use_mask_for_norm": f... '
     'are not what fold_0/model.onnx was exported and checked with (3, [{"intensity_properties": {}, "scheme": '),
    ("num_segmentation_heads", _set(num_segmentation_heads=3, labels={"background": 0, "polyp": 1, "other": 2}), {},
     'num_segmentation_heads 3, labels {"background": 0, "polyp": 1, "other": 2} are not what fold_0/model.onnx '
     'was exported and checked with (2, {"background": 0, "polyp": 1})'),
    ("normalization", _set_normalization(0, scheme="RescaleTo01Normalization"), {},
     'normalization[0].scheme "RescaleTo01Normalization" is not what fold_0/model.onnx was exported and checked '
     'with ("ZScoreNormalization")'),
    ("normalization", _set_normalization(1, use_mask_for_norm=True), {},
     "normalization[1].use_mask_for_norm true is not what fold_0/model.onnx was exported and checked with (false)"),
    ("normalization", lambda d: d["normalization"][0]["intensity_properties"].update(mean=50.0), CT,
     "normalization[0].intensity_properties.mean 50.0 is not what fold_0/model.onnx was exported and checked with "
     "(10.0)"),
    ("transpose_forward", _set(transpose_forward=[0, 2, 1], transpose_backward=[0, 2, 1]), {},
     "transpose_forward [0, 2, 1], transpose_backward [0, 2, 1] are not what fold_0/model.onnx was exported and "
     "checked with ([0, 1, 2], [0, 1, 2])"),
    ("spacing", _set(spacing=[2.0, 2.0]), {},
     "spacing [2.0, 2.0] is not what fold_0/model.onnx was exported and checked with ([1.0, 1.0])"),
    ("spacing", lambda d: d.pop("spacing"), {},
     "spacing (missing) is not what fold_0/model.onnx was exported and checked with ([1.0, 1.0])"),
    ("file_ending", _set(file_ending=".bmp"), {},
     'file_ending ".bmp" is not what fold_0/model.onnx was exported and checked with (".png")'),
    ("labels", _set(labels={"background": 0, "tumour": 1}), {},
     'labels {"background": 0, "tumour": 1} is not what fold_0/model.onnx was exported and checked with '
     '({"background": 0, "polyp": 1})'),
    ("regions_class_order", _set(regions_class_order=[2, 1]), REGIONS,
     "regions_class_order [2, 1] is not what fold_0/model.onnx was exported and checked with ([1, 2])"),
    ("mirror_axes", _set(mirror_axes=[1]), {},
     "mirror_axes [1] is not what fold_0/model.onnx was exported and checked with ([0, 1])"),
    ("mirror_axes", _set(mirror_axes=None), {},
     "mirror_axes null is not what fold_0/model.onnx was exported and checked with ([0, 1])"),
    ("tile_step_size", _set(tile_step_size=0.25), {},
     "tile_step_size 0.25 is not what fold_0/model.onnx was exported and checked with (0.5)"),
]
EDITED_FIELDS = [Row(f"predict_onnx/edited_{field}_{i}", "predict_onnx", pred_edited(edit, **fields), 2,
                     [f"model/{DESCRIPTION_FILE}: {message}"])
                 for i, (field, edit, fields, message) in enumerate(_EDITS)]


def test_every_field_the_graphs_hold_has_an_edited_row():
    assert {field for field, *_ in _EDITS} | {"transpose_backward"} == set(GRAPH_FIELDS)


ROWS = [
    Row("predict_onnx/output_is_input", "predict_onnx", pred_output_is_input, 2,
        ["-o ", "/in is the input folder -i ", "never writes into its inputs"]),
    Row("predict_onnx/output_links_to_input", "predict_onnx", pred_output_links_to_input, 2,
        ["-o ", "/predictions is the input folder -i "]),
    Row("predict_onnx/output_file_is_an_input", "predict_onnx", pred_output_file_is_an_input, 2,
        ["out/case1.png (the output of case case1) would overwrite the input file ", "in/case1_0000.png"]),
    Row("predict_onnx/output_not_ours", "predict_onnx", pred_output_not_ours, 2,
        ["out/case2.png exists and was not written by nnUNetv2_meddisseg_predict_onnx", "--overwrite"]),
    Row("predict_onnx/records_folder_a_link", "predict_onnx", pred_records_folder_a_link, 2,
        [f"out/{RECORD_FOLDER} is a symbolic link: ", "keeps its records"]),
    Row("predict_onnx/records_folder_a_file", "predict_onnx", pred_records_folder_a_file, 2,
        [f"out/{RECORD_FOLDER} is not a folder: ", "keeps its records"]),
    Row("predict_onnx/patch_size_zero", "predict_onnx", pred_field("patch_size", [0, 16]), 2,
        [f"model/{DESCRIPTION_FILE}: patch_size must be two integers from 1 to 4096 (a 2D patch), got [0, 16]"]),
    Row("predict_onnx/huge_patch_size", "predict_onnx", pred_field("patch_size", [150000, 150000]), 2,
        ["patch_size must be two integers from 1 to 4096 (a 2D patch), got [150000, 150000]"]),
    Row("predict_onnx/mirror_axis_beyond_the_image", "predict_onnx", pred_field("mirror_axes", [0, 2]), 2,
        ["mirror_axes must be null or a list of distinct image axes (0, 1), got [0, 2]"]),
    Row("predict_onnx/labels_as_a_list", "predict_onnx", pred_field("labels", ["background", "polyp"]), 2,
        ["labels must be an object of label names"]),
    Row("predict_onnx/transpose_no_permutation", "predict_onnx", pred_field("transpose_forward", [0, 2, 2]), 2,
        ["transpose_forward must be a permutation of [0, 1, 2]"]),
    Row("predict_onnx/format_1", "predict_onnx", pred_field("format_version", 1), 2,
        ["format version 1, this predictor reads 2: export the model again"]),
    Row("predict_onnx/fold_file_outside", "predict_onnx", pred_fold_file_outside, 2,
        ["fold 0's file \"../in/model.onnx\" must be a path inside the model folder"]),
    Row("predict_onnx/graph_replaced", "predict_onnx", pred_graph(lambda: tiny_graph(5), record=False), 2,
        ["model/fold_0/model.onnx: its sha256 ", f"that {DESCRIPTION_FILE} records"]),
    Row("predict_onnx/empty_graph", "predict_onnx", pred_graph(lambda: b"", record=False), 2,
        ["model/fold_0/model.onnx: empty (0 bytes)"]),
    Row("predict_onnx/truncated_graph", "predict_onnx", pred_graph(lambda: tiny_graph(0)[:100], record=True), 2,
        ["model/fold_0/model.onnx: not an ONNX graph (a field runs past the end): copy the model folder again"]),
    Row("predict_onnx/corrupt_graph", "predict_onnx", pred_graph(unknown_operator, record=True), 2,
        ["model/fold_0/model.onnx: ", "cannot load it ("]),
    Row("predict_onnx/graph_without_its_fields", "predict_onnx", pred_graph(lambda: traced_graph(0), record=True), 2,
        ["model/fold_0/model.onnx: carries no record of the fields it was exported and checked with "
         f"(nnunetv2_meddisseg.description in its metadata; one expected), against which {DESCRIPTION_FILE} is "
         "checked: export the model again"]),
    Row("predict_onnx/graph_fields_edited_without_its_sha256", "predict_onnx", pred_rebound_graph, 2,
        ["model/fold_0/model.onnx: its sha256 ", f"that {DESCRIPTION_FILE} records"]),
    Row("predict_onnx/graph_of_other_classes", "predict_onnx",
        pred_graph(lambda: tiny_graph(0, out_channels=3), record=True), 2,
        ["model/fold_0/model.onnx: the graph's output has 3 segmentation heads, onnx_model.json says 2"]),
    Row("predict_onnx/graph_of_other_channels", "predict_onnx",
        pred_graph(lambda: tiny_graph(0, in_channels=1), record=True), 2,
        ["the graph's input has 1 input channels, onnx_model.json says 3"]),
    *EDITED_FIELDS,
    Row("predict_onnx/regions_model_as_exported", "predict_onnx", pred_as_exported(**REGIONS), 0,
        check=pred_masks_written),
    Row("predict_onnx/ct_model_as_exported", "predict_onnx", pred_as_exported(**CT), 0, check=pred_masks_written),
    Row("predict_onnx/num_parts_zero", "predict_onnx", pred_parts("-num_parts", "0"), 2,
        ["-num_parts must be at least 1, got 0"]),
    Row("predict_onnx/part_id_too_large", "predict_onnx", pred_parts("-num_parts", "3", "-part_id", "3"), 2,
        ["-part_id must be from 0 to 2 (-num_parts 3; parts count from 0), got 3"]),
    Row("predict_onnx/grey_with_alpha", "predict_onnx", pred_grey_with_alpha, 2,
        ["in/case0_0000.png: reads as an array of shape (8, 8, 2), expected a 2D grey, RGB or RGBA image"]),
    Row("predict_onnx/output_under_a_file", "predict_onnx", pred_output_under_a_file, 2,
        ["cannot write ", "a_file/out"]),
    Row("predict_onnx/palette_image", "predict_onnx", pred_palette_image, 0, check=pred_palette_check),
    Row("predict_onnx/nan_pixel", "predict_onnx", pred_float_tiff(float("nan")), 2,
        ["in/case0_0000.tif: 1 NaN and 0 infinite pixel(s) of 256: the model cannot predict undefined values",
         "numpy.nan_to_num"]),
    Row("predict_onnx/inf_pixel", "predict_onnx", pred_float_tiff(float("inf")), 2,
        ["in/case0_0000.tif: 0 NaN and 1 infinite pixel(s) of 256"]),
    Row("predict_onnx/minus_inf_pixel", "predict_onnx", pred_float_tiff(float("-inf")), 2,
        ["in/case0_0000.tif: 0 NaN and 1 infinite pixel(s) of 256"]),
    Row("predict_onnx/float_tiff", "predict_onnx", pred_float_tiff(), 0, check=pred_float_tiff_check),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(row: Row, tmp_path, nnunet_dirs, capsys):
    check_row(row, tmp_path, nnunet_dirs, capsys)
