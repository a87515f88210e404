"""The description of an exported model: the JSON file beside the folds' ``model.onnx`` files, which the export
writes and the predictor reads without PyTorch or nnU-Net. It holds what nnU-Net's predictor takes from the plans,
dataset.json and checkpoint, what was exported (each fold's graph, its sha256, its check against PyTorch) and each
fold's reduced ``precisions`` with the guard's settings.

A model folder is not trusted because it is there: its files must lie inside it and match their recorded sha256,
and each graph carries the ``GRAPH_FIELDS`` it was exported with, so an edit of the description alone is refused.
Each refusal is one line naming the file and the field.
"""
from __future__ import annotations

import hashlib
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path, PurePosixPath
from typing import (
    Annotated,
    Any,
    Callable,
    ClassVar,
    Dict,
    Iterator,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WrapValidator, model_validator
from pydantic_core import PydanticCustomError

from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import find_set_aside, is_inside

__all__ = ["DESCRIPTION_FILE", "MODEL_FILE", "FORMAT_VERSION", "WRITTEN_BY", "INPUT_NAME", "OUTPUT_NAME",
           "NATURAL_IMAGE_ENDINGS", "NORMALIZATION_SCHEMES", "MAX_PATCH_SIDE", "GraphFields", "Description",
           "read_description", "validate_description", "fold_model_file", "fold_file",
           "model_file", "read_fold_model", "read_model_file", "check_graph_io", "check_step_size", "sha256_of",
           "REDUCED_PRECISIONS", "GRAPH_FIELDS", "GRAPH_FIELDS_KEY", "graph_fields", "bind_graph",
           "recorded_graph_fields"]

#: the description's file name in an export folder
DESCRIPTION_FILE = "onnx_model.json"
#: each fold's graph: ``fold_<f>/model.onnx``
MODEL_FILE = "model.onnx"
FORMAT_VERSION = 2
#: the value of the description's ``written_by`` field: the export folder is ours to replace
WRITTEN_BY = "nnUNetv2_meddisseg_export"
#: the graph's input (B, C, H, W) and output (B, segmentation heads, H, W) names
INPUT_NAME, OUTPUT_NAME = "image", "logits"
#: what nnU-Net's 2D natural-image reader (NaturalImage2DIO) reads
NATURAL_IMAGE_ENDINGS = (".png", ".bmp", ".tif")
#: nnU-Net's normalisation schemes that ``image_pipeline.normalise_channel`` runs
NORMALIZATION_SCHEMES = ("ZScoreNormalization", "CTNormalization", "NoNormalization", "RescaleTo01Normalization",
                         "RGBTo01Normalization")
#: the largest patch side accepted (nnU-Net plans 2D patches of at most a few thousand pixels a side)
MAX_PATCH_SIDE = 4096
#: the largest label value a mask file holds (nnU-Net writes 16-bit masks from label 255)
MAX_LABEL = 65535
#: the precisions the export verifies and records per fold (``deploy.precision_guard``)
REDUCED_PRECISIONS = ("bf16", "int8")
#: the ONNX ``metadata_props`` key of ``GRAPH_FIELDS``; OpenVINO keeps it in an IR's ``rt_info`` section ``framework``
GRAPH_FIELDS_KEY = "nnunetv2_meddisseg.description"

_CT_PROPERTIES = ("mean", "std", "percentile_00_5", "percentile_99_5")
#: the error types of the schema's one-line refusals (pydantic's "missing" among them)
_OURS = ("expected", "message", "missing")

Dim = Union[int, str, None]


def fold_model_file(fold: Any) -> str:
    """A fold's graph, relative to the export folder."""
    return f"fold_{fold}/{MODEL_FILE}"


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: a field one side lacks (shown as "(missing)")
_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(missing)"
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def check_step_size(step: Any, patch_size: Sequence[int], what: str) -> float:
    """Check the sliding window's ``step``, a fraction of the patch: in (0, 1] and at least one pixel per axis."""
    if not (_is_number(step) and 0 < step <= 1):
        raise UserError(f"{what} must be a number in (0, 1], got {_show(step)}")
    if any(step * p < 1 for p in patch_size):
        raise UserError(f"{what} {step:g} is below one pixel of the patch {list(patch_size)}: at least "
                        f"{1 / min(patch_size):.3g}")
    return float(step)


def _refusal(expected: str, field: str = "", got: Optional[str] = None) -> PydanticCustomError:
    """``field`` (below the object checked) must be ``expected``; ``got``: the value as shown (None: the value)."""
    return PydanticCustomError("expected", "{expected}", {"expected": expected, "field": field, "got": got})


def _missing(field: str) -> PydanticCustomError:  # as pydantic's own
    return PydanticCustomError("missing", "missing", {"field": field})


def _expect(text: str) -> WrapValidator:
    """Refuse any error of a field's own value as "must be ``text``"; nested one-line refusals pass unchanged."""
    def wrap(value: Any, handler: Any) -> Any:
        try:
            return handler(value)
        except ValidationError as e:
            if any(error["type"] in _OURS for error in e.errors()):
                raise
            raise _refusal(text) from None
    return WrapValidator(wrap)


class _Object(BaseModel):
    """A JSON object of the description: its fields of exactly their JSON types (no conversion), others kept."""
    model_config = ConfigDict(strict=True, extra="allow")
    #: what the object is, in words
    what: ClassVar[str] = "an object"

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _refusal(cls.what)
        return data


def _holds(condition: Callable[[Any], bool]) -> AfterValidator:
    """A value for which ``condition`` holds (refused in the words of its field's ``_expect``)."""
    def check(value: Any) -> Any:
        if not condition(value):
            raise ValueError("the condition does not hold")
        return value
    return AfterValidator(check)


_Text = Annotated[str, Field(min_length=1), _expect("a non-empty string")]
_Number = Annotated[float, Field(allow_inf_nan=False), _expect("a finite number")]
_Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False), _expect("a number from 0 to 1")]
_Transpose = Annotated[List[int], _holds(lambda axes: axes in ([0, 1, 2], [0, 2, 1])),
                       _expect("a permutation of [0, 1, 2] that keeps axis 0 first (a 2D model)")]
_SHA256 = r"^[0-9a-f]{64}$"


class Normalization(_Object):
    what = "an object with scheme, use_mask_for_norm and intensity_properties"
    scheme: Annotated[Literal[NORMALIZATION_SCHEMES], _expect(
        f"one of nnU-Net's schemes ({', '.join(NORMALIZATION_SCHEMES)})")]
    use_mask_for_norm: Annotated[bool, _expect("true or false")]
    intensity_properties: Annotated[Dict[str, Any], _expect("an object (the channel's intensity properties)")]

    @model_validator(mode="after")
    def _ct_properties(self) -> "Normalization":
        if self.scheme == "CTNormalization":
            for key in _CT_PROPERTIES:
                value = self.intensity_properties.get(key)
                if not _is_number(value):
                    raise _refusal("a finite number (CTNormalization uses it)", f"intensity_properties.{key}",
                                   _show(value))
        return self


class GraphFields(_Object):
    """The fields that change the prediction (``GRAPH_FIELDS``) and the rules that tie them together."""
    what = "a JSON object"
    patch_size: Annotated[List[Annotated[int, Field(ge=1, le=MAX_PATCH_SIDE)]], Field(min_length=2, max_length=2),
                          _expect(f"two integers from 1 to {MAX_PATCH_SIDE} (a 2D patch)")]
    num_input_channels: Annotated[int, Field(ge=1), _expect("an integer >= 1")]
    num_segmentation_heads: Annotated[int, Field(ge=1), _expect("an integer >= 1")]
    normalization: Annotated[List[Normalization], _expect("a list of entries, one per input channel")]
    transpose_forward: _Transpose
    transpose_backward: _Transpose
    spacing: Annotated[List[float], _expect("a list of numbers (the plans' spacing)")] = None
    file_ending: Annotated[Literal[NATURAL_IMAGE_ENDINGS], _expect(f"one of {', '.join(NATURAL_IMAGE_ENDINGS)}")]
    labels: Annotated[Dict[str, Any], Field(min_length=1), _expect(
        "an object of label names to integers from 0 to 65535 or lists of them (regions), with background 0")]
    regions_class_order: Any  # null, or one label per region: checked with the labels
    mirror_axes: Annotated[Optional[List[Annotated[int, Field(ge=0, lt=2)]]],
                           _holds(lambda axes: axes is None or len(set(axes)) == len(axes)),
                           _expect("null or a list of distinct image axes (0, 1)")]
    tile_step_size: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _expect("a number in (0, 1]")]

    @model_validator(mode="after")
    def _agree(self) -> "GraphFields":
        channels = self.num_input_channels
        if len(self.normalization) != channels:
            raise _refusal(f"a list of {channels} entries (one per input channel)", "normalization",
                           f"{len(self.normalization)} entries")
        forward, backward = self.transpose_forward, self.transpose_backward
        if [forward[a] for a in backward] != [0, 1, 2]:
            raise _refusal(f"the inverse of transpose_forward {forward}", "transpose_backward", _show(backward))
        _check_labels(self.labels, self.regions_class_order, self.num_segmentation_heads)
        try:
            check_step_size(self.tile_step_size, self.patch_size, "tile_step_size")
        except UserError as e:
            raise PydanticCustomError("message", "{message}", {"message": str(e)}) from None
        return self


def _check_labels(labels: Dict[str, Any], order: Any, heads: int) -> None:
    """As nnU-Net's LabelManager: background 0, labels 0..K-1 for K heads, or regions (list-valued labels) with one
    head per foreground region and regions_class_order naming each head's label; an ignore label above all others."""
    def fail(field: str, expected: str, value: Any) -> None:
        raise _refusal(expected, field, _show(value))

    listed = {name: value if isinstance(value, list) else [value] for name, value in labels.items()}
    for name, values in listed.items():
        if not values or not all(_is_int(v) and 0 <= v <= MAX_LABEL for v in values):
            fail(f"labels[{_show(name)}]", "an integer from 0 to 65535 or a non-empty list of them", labels[name])
    if labels.get("background") != 0 or isinstance(labels.get("background"), bool):
        fail('labels["background"]', "0", labels.get("background"))
    if "ignore" in labels and not _is_int(labels["ignore"]):
        fail('labels["ignore"]', "an integer", labels["ignore"])
    used = [values for name, values in listed.items() if name != "ignore"]
    all_labels = sorted({v for values in used for v in values})
    if "ignore" in labels and labels["ignore"] != all_labels[-1] + 1:
        fail('labels["ignore"]', f"the largest label value ({all_labels[-1] + 1}, as nnU-Net requires)",
             labels["ignore"])
    if not any(len(values) > 1 for values in listed.values()):
        if order is not None:
            fail("regions_class_order", "null for a model without regions", order)
        if all_labels != list(range(len(all_labels))):
            fail("labels", "the values 0, 1, ..., K-1 (consecutive, as nnU-Net requires)", all_labels)
        if heads != len(all_labels):
            fail("num_segmentation_heads", f"the number of labels ({len(all_labels)})", heads)
        return
    regions = [values for values in used if set(values) != {0}]
    if heads != len(regions):
        fail("num_segmentation_heads", f"the number of foreground regions ({len(regions)})", heads)
    if not (isinstance(order, list) and len(order) == heads and all(_is_int(v) and 1 <= v <= MAX_LABEL
                                                                    for v in order)):
        fail("regions_class_order", f"a list of {heads} label values from 1 to 65535 (one per region)", order)


#: the fields that change the prediction, written into every graph; the predictor refuses a description that differs
GRAPH_FIELDS = tuple(GraphFields.model_fields)


class Figures(_Object):
    """The guard's figures of a candidate (``deploy.precision_guard.Verifier.figures``)."""
    what = "an object of the guard's figures"
    cases: Annotated[int, Field(ge=1), _expect("an integer >= 1 (the validation cases)")]
    mean_dice_to_fp32: _Fraction
    min_dice_to_fp32: _Fraction
    pseudo_dice_fp32: _Fraction
    pseudo_dice: _Fraction
    pseudo_dice_drop_points: _Number


class Outcome(_Object):
    """A verification's outcome: ``verified``; the ``figures`` where it is, the ``reason`` where it is not."""
    what = "an object with verified true or false"
    #: the fields a verified outcome holds
    when_verified: ClassVar[Tuple[str, ...]] = ("figures",)
    verified: Annotated[bool, _expect("true or false")]
    reason: Annotated[str, Field(min_length=1), _expect("a non-empty string (why the guard refused it)")] = None
    figures: Figures = None

    @model_validator(mode="after")
    def _as_verified(self) -> "Outcome":
        for name in self.when_verified if self.verified else ("reason",):
            if getattr(self, name) is None:
                raise _missing(name)
        return self


class Record(Outcome):
    """A fold's bf16 record; ``model``: the fold's file, or an IR ``.xml`` with its ``.bin`` among ``files``."""
    when_verified = ("files", "model", "kept_in_fp32", "figures")
    files: Annotated[Dict[Annotated[str, Field(min_length=1)], Annotated[str, Field(pattern=_SHA256)]], _expect(
        "an object of paths in the model folder to their sha256 (64 hexadecimal digits)")] = None
    model: Annotated[str, _expect("a path in the model folder")] = None
    kept_in_fp32: Annotated[List[Annotated[str, Field(min_length=1)]], _expect("a list of block names")] = None
    floats_in_bf16: Annotated[None, _expect("absent (an int8 record's verification of its floats in bf16)")] = None


class Int8Record(Record):
    """A fold's int8 record: a bf16 record's fields (the IR), and ``floats_in_bf16``: its floats verified in bf16."""
    floats_in_bf16: Outcome = None


class Precisions(_Object):
    model_config = ConfigDict(extra="forbid")
    what = f"an object with records of {' and '.join(REDUCED_PRECISIONS)}"
    bf16: Record = None
    int8: Int8Record = None


class Fold(_Object):
    what = "an object with fold, file and sha256"
    fold: _Text
    file: Annotated[str, Field(min_length=1), _expect("a path relative to the model folder")]
    sha256: Annotated[str, Field(pattern=_SHA256), _expect("the graph's sha256 (64 hexadecimal digits)")]
    precisions: Annotated[Precisions, _expect(Precisions.what)] = None

    @model_validator(mode="after")
    def _graphs(self) -> "Fold":
        for precision in REDUCED_PRECISIONS:
            record = getattr(self.precisions, precision, None)
            if record is None or not record.verified:
                continue
            model, files = record.model, record.files
            ir = model.endswith(".xml") and model in files and (model[:-len(".xml")] + ".bin") in files
            if not ((model == self.file and precision == "bf16") or ir):
                raise _refusal("an OpenVINO IR (.xml) listed in files with its .bin"
                               + (", or the fold's file" if precision == "bf16" else ""),
                               f"precisions.{precision}.model", _show(model))
        return self


class GuardBounds(_Object):
    what = "an object with min_dice_to_fp32 and max_pseudo_dice_drop"
    min_dice_to_fp32: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False), _expect("a number in (0, 1]")]
    max_pseudo_dice_drop: _Number


class Guard(_Object):
    what = "an object with the guard's bounds (where a fold has precisions)"
    bounds: GuardBounds
    calibration_tiles: Annotated[int, Field(ge=1), _expect("an integer >= 1")]


class Description(GraphFields):
    """``onnx_model.json``: GraphFields, what was exported, distinct folds, the guard if a fold has precisions."""
    format_version: Annotated[Literal[FORMAT_VERSION], _expect(str(FORMAT_VERSION))]
    written_by: Annotated[Literal[WRITTEN_BY], _expect(json.dumps(WRITTEN_BY))]
    trainer: _Text
    plans: _Text
    configuration: _Text
    checkpoint: _Text
    folds: Annotated[List[Fold], Field(min_length=1), _expect("a non-empty list")]
    precision_guard: Guard = None

    @model_validator(mode="after")
    def _folds_and_guard(self) -> "Description":
        names = [fold.fold for fold in self.folds]
        if len(set(names)) != len(names):
            raise _refusal("a list of distinct folds", "folds", _show(names))
        if self.precision_guard is None and any(fold.precisions is not None for fold in self.folds):
            raise _missing("precision_guard")
        return self


def _one_line(error: Dict[str, Any]) -> str:
    """pydantic's error as one line naming the field (``folds[0].precisions.int8``)."""
    context = error.get("ctx") or {}
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
    below = context.get("field")
    field = (f"{field}.{below}" if below else field).lstrip(".")
    if error["type"] == "message":
        return context["message"]
    if error["type"] == "missing":
        return f"{field} is missing"
    got = context.get("got") or _show(error["input"])
    if error["type"] == "expected":
        return f"{field} must be {context['expected']}, got {got}"
    return f"{field}: {' '.join(error['msg'].split())}, got {got}"


def validate_description(description: Any, path: Path, schema: Type[_Object] = Description) -> Dict[str, Any]:
    """Check ``description`` (the parsed ``path``) against ``schema``; return it as given, or refuse in one line."""
    if not isinstance(description, dict):
        raise UserError(f"{path}: expected a JSON object (a file written by {WRITTEN_BY}), got {_show(description)}")
    if "format_version" in schema.model_fields and description.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise UserError(f"{path}: format version {_show(description['format_version'])}, this predictor reads "
                        f"{FORMAT_VERSION}: export the model again")
    missing = [name for name, field in schema.model_fields.items() if field.is_required() and name not in description]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)} (expected a file written by {WRITTEN_BY})")
    try:
        schema.model_validate(description)
    except ValidationError as e:
        raise UserError(f"{path}: {_one_line(e.errors()[0])}") from None
    return description


def model_file(folder: Path, name: str, owner: str) -> Path:
    """The file ``name``, relative as recorded, checked to be a file inside ``folder`` (no ``..``, no absolute path,
    no symbolic link out); ``owner`` names its entry in the error (``fold 0's int8 graph``)."""
    folder = Path(folder)
    relative = PurePosixPath(name)
    where = f"{folder / DESCRIPTION_FILE}: {owner}'s file {_show(name)}"
    if relative.is_absolute() or ".." in relative.parts or "\\" in name:
        raise UserError(f"{where} must be a path inside the model folder, without '..'")
    path = folder / relative
    if not is_inside(path, folder):
        raise UserError(f"{where} leads out of the model folder (to {path.resolve()}): a model folder holds its own "
                        f"graphs")
    if not path.is_file():
        raise UserError(f"{path}: missing ({owner} of {folder / DESCRIPTION_FILE})")
    return path


def fold_file(folder: Path, fold: Dict[str, Any]) -> Path:
    """The graph file of ``fold``, an entry of the description's ``folds``."""
    return model_file(folder, fold["file"], f"fold {fold['fold']}")


def read_fold_model(folder: Path, fold: Dict[str, Any], description: Dict[str, Any]) -> bytes:
    """The bytes of ``fold``'s graph, checked against its recorded sha256 and against ``description``."""
    return read_model_file(folder, fold["file"], fold["sha256"], f"fold {fold['fold']}", description)


def read_model_file(folder: Path, name: str, sha256: str, owner: str,
                    description: Optional[Dict[str, Any]] = None) -> bytes:
    """The bytes of ``name`` in ``folder``, checked against ``sha256``; with ``description``, also a graph's fields."""
    path = model_file(folder, name, owner)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not data:
        raise UserError(f"{path}: empty (0 bytes): an interrupted copy? copy the model folder again or export again")
    digest = sha256_of(data)
    if digest != sha256:
        raise UserError(f"{path}: its sha256 {digest[:16]}... is not the {sha256[:16]}... that "
                        f"{DESCRIPTION_FILE} records: the file was changed, damaged or replaced after the export; "
                        f"copy the model folder again or export again")
    if description is not None:
        _check_graph_fields(Path(folder), name, data, description)
    return data


def graph_fields(description: Dict[str, Any]) -> str:
    """The description's GRAPH_FIELDS as canonical JSON (keys sorted, no spaces, ASCII), as written into graphs."""
    return json.dumps({key: description[key] for key in GRAPH_FIELDS if key in description}, sort_keys=True,
                      separators=(",", ":"))


def bind_graph(model: bytes, description: Dict[str, Any]) -> bytes:
    """ONNX ``model`` with the GRAPH_FIELDS in ``metadata_props`` key GRAPH_FIELDS_KEY, so its sha256 covers them."""
    import onnx

    proto = onnx.load_from_string(model)
    kept = {entry.key: entry.value for entry in proto.metadata_props if entry.key != GRAPH_FIELDS_KEY}
    onnx.helper.set_model_props(proto, {**kept, GRAPH_FIELDS_KEY: graph_fields(description)})
    return proto.SerializeToString()


def _varint(data: bytes, at: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _protobuf_fields(data: bytes, start: int = 0, end: Optional[int] = None) -> Iterator[Tuple[int, int, Any]]:
    """(number, wire type, value) per field of ``data[start:end]``; a length-delimited value: its unread span."""
    at, end = start, len(data) if end is None else end
    while at < end:
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = (at, at + size), at + size
        elif wire in (1, 5):
            value, at = None, at + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire}")
        if number == 0:
            raise ValueError("a field numbered 0")
        if at > end:
            raise ValueError("a field runs past the end")
        yield number, wire, value


def _onnx_metadata(data: bytes) -> List[Tuple[str, str]]:
    """An ONNX ModelProto's ``metadata_props`` (key, value), without ``onnx``: field 14, entries of key 1, value 2."""
    entries = []
    for number, wire, value in _protobuf_fields(data):
        if number == 14 and wire == 2:
            entry = {n: data[v[0]:v[1]].decode("utf-8") for n, w, v in _protobuf_fields(data, *value) if w == 2}
            entries.append((entry.get(1, ""), entry.get(2, "")))
    return entries


def _ir_metadata(data: bytes) -> List[Tuple[str, str]]:
    """The (name, value) entries of an IR's ``rt_info`` section ``framework``, where OpenVINO keeps ONNX metadata."""
    root = ET.fromstring(data)
    return [(entry.tag, entry.get("value", "")) for info in root.findall("rt_info")
            for section in info if section.tag == "framework" for entry in section]


def recorded_graph_fields(data: bytes, name: str) -> List[str]:
    """The GRAPH_FIELDS texts in graph ``data`` (IR if ``name`` ends in .xml, else ONNX); ValueError if not a graph."""
    try:
        entries = _ir_metadata(data) if name.endswith(".xml") else _onnx_metadata(data)
    except (ET.ParseError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"not {'an OpenVINO IR' if name.endswith('.xml') else 'an ONNX graph'} ({e})") from None
    return [value for key, value in entries if key == GRAPH_FIELDS_KEY]


def _differences(field: str, recorded: Any, given: Any) -> List[Tuple[str, Any, Any]]:
    """(path, recorded, given) where they differ, into objects of equal keys and equal-length lists of objects."""
    if isinstance(recorded, dict) and isinstance(given, dict) and set(recorded) == set(given):
        return [d for key in sorted(recorded) for d in _differences(
            f"{field}.{key}" if key.isidentifier() else f"{field}[{json.dumps(key)}]", recorded[key], given[key])]
    if (isinstance(recorded, list) and isinstance(given, list) and len(recorded) == len(given)
            and all(isinstance(v, dict) for v in recorded + given)):
        return [d for i, (r, g) in enumerate(zip(recorded, given)) for d in _differences(f"{field}[{i}]", r, g)]
    same = (recorded is _MISSING) == (given is _MISSING) and (
        recorded is _MISSING or json.dumps(recorded, sort_keys=True) == json.dumps(given, sort_keys=True))
    return [] if same else [(field, recorded, given)]


def _check_graph_fields(folder: Path, name: str, data: bytes, description: Dict[str, Any]) -> None:
    """Refuse a graph without one record of its GRAPH_FIELDS, or a description whose fields are not those."""
    try:
        records = recorded_graph_fields(data, name)
    except ValueError as e:
        raise UserError(f"{folder / name}: {e}: copy the model folder again or export again") from None
    if len(records) != 1:
        raise UserError(f"{folder / name}: carries {len(records) or 'no'} record{'s' if records else ''} of the "
                        f"fields it was exported and checked with ({GRAPH_FIELDS_KEY} in its metadata; one "
                        f"expected), against which {DESCRIPTION_FILE} is checked: export the model again with "
                        f"{WRITTEN_BY}")
    try:
        recorded = json.loads(records[0])
    except json.JSONDecodeError:
        recorded = None
    if not isinstance(recorded, dict):
        raise UserError(f"{folder / name}: its record of the fields it was exported with ({GRAPH_FIELDS_KEY}) is "
                        f"not a JSON object: export the model again with {WRITTEN_BY}")
    given = {key: description[key] for key in GRAPH_FIELDS if key in description}
    keys = [k for k in GRAPH_FIELDS if k in recorded or k in given] + sorted(set(recorded) - set(GRAPH_FIELDS))
    differences = [d for key in keys
                   for d in _differences(key, recorded.get(key, _MISSING), given.get(key, _MISSING))]
    if not differences:
        return
    listed = differences[:3]
    more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
    raise UserError(f"{folder / DESCRIPTION_FILE}: {', '.join(f'{path} {_show(g)}' for path, _, g in listed)}{more} "
                    f"{'is' if len(differences) == 1 else 'are'} not what {name} was exported and checked with "
                    f"({', '.join(_show(r) for _, r, _ in listed)}): the description was edited; export again")


def _fixed(dim: Dim) -> bool:
    return _is_int(dim) and dim >= 0


def check_graph_io(input_shape: Optional[Sequence[Dim]], output_shape: Optional[Sequence[Dim]],
                   description: Dict[str, Any], where: str) -> None:
    """Check a loaded graph's (B, C, H, W) input and output shapes (axes int, or None / a name if symbolic): the
    described channels or heads, a symbolic batch, H and W symbolic or the patch size; a symbolic C passes."""
    patch = description["patch_size"]
    axes = {"input": (input_shape, description["num_input_channels"], "input channels"),
            "output": (output_shape, description["num_segmentation_heads"], "segmentation heads")}
    for name, (shape, expected, what) in axes.items():
        if shape is None or len(shape) != 4:
            raise UserError(f"{where}: the graph's {name} has shape {_show(list(shape) if shape else shape)}, "
                            f"expected (batch, {what}, height, width)")
        batch, channels, height, width = shape
        if _fixed(channels) and channels != expected:
            raise UserError(f"{where}: the graph's {name} has {channels} {what}, {DESCRIPTION_FILE} says "
                            f"{expected}: graph and description do not belong together")
        if _fixed(batch):
            raise UserError(f"{where}: the graph's {name} has a fixed batch of {batch}; the predictor runs batches "
                            f"of tiles (the export writes a symbolic batch axis)")
        for axis, size, p in (("height", height, patch[0]), ("width", width, patch[1])):
            if _fixed(size) and size != p:
                raise UserError(f"{where}: the graph's {name} has a fixed {axis} of {size}, the patch is {patch}")


def read_description(folder: Path) -> Dict[str, Any]:
    """The description in export ``folder``, checked against its schema, with each fold's files inside ``folder``."""
    folder = Path(folder)
    path = folder / DESCRIPTION_FILE
    if not path.is_file():
        old = None if folder.exists() else find_set_aside(folder)
        hint = (f"; an interrupted export left the previous one aside as {old}: rerun the export (which puts it back) "
                f"or move it to {folder}") if old is not None else ""
        raise UserError(f"{folder}: no {DESCRIPTION_FILE} (expected a folder written by {WRITTEN_BY}){hint}")
    try:
        description = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from e
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e})") from None
    validate_description(description, path)
    for fold in description["folds"]:
        fold_file(folder, fold)
        for precision, record in fold.get("precisions", {}).items():
            for name in record.get("files", {}) if record["verified"] else ():
                model_file(folder, name, f"fold {fold['fold']}'s {precision} graph")
    return description
