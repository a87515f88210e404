"""The device run's preparation and harness pieces that run without a GPU: the SimpleITK stand-in
(with nnU-Net's PNG reader path), the wheel check, the resized Kvasir-SEG copy and the console-command
scripts."""
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[2]
DEVICE_DIR = REPO_ROOT / "benchmarks" / "device"
STANDIN = DEVICE_DIR / "standins" / "SimpleITK.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare():
    return _load("device_prepare", DEVICE_DIR / "prepare.py")


@pytest.fixture(scope="module")
def device_run():
    return _load("device_run", DEVICE_DIR / "run.py")


def test_standin_names_itself_on_any_real_use():
    sitk = _load("SimpleITK_standin", STANDIN)
    assert sitk.IS_STANDIN
    assert isinstance(sitk.Image, type)  # annotations such as `-> sitk.Image` evaluate
    with pytest.raises(RuntimeError, match="stand-in"):
        sitk.Image([4, 4], 1)
    for name in ("ReadImage", "GetArrayFromImage", "sitkLinear"):
        with pytest.raises(AttributeError, match="stand-in"):
            getattr(sitk, name)
    assert not hasattr(sitk, "__wrapped__")  # dunder look-ups stay plain AttributeErrors


_DEVICE_IMPORTS = r"""
import sys
import numpy as np
from PIL import Image
import SimpleITK
assert getattr(SimpleITK, "IS_STANDIN", False), SimpleITK.__file__
import nnunetv2.experiment_planning.plan_and_preprocess_entrypoints, nnunetv2.run.run_training
import nnunetv2.inference.predict_from_raw_data, nnunetv2.evaluation.evaluate_predictions
import nnunetv2_meddisseg.datasets.convert, nnunetv2_meddisseg.evaluation.compare
import nnunetv2_meddisseg.planning.plan_meddisseg, nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg
from nnunetv2.imageio.reader_writer_registry import determine_reader_writer_from_dataset_json
image = np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8)
Image.fromarray(image).save(sys.argv[1])
io = determine_reader_writer_from_dataset_json({"file_ending": ".png"}, sys.argv[1], verbose=False)
data, props = io().read_images((sys.argv[1],))
assert io.__name__ == "NaturalImage2DIO", io
assert data.shape == (3, 1, 20, 24) and (data[:, 0].transpose(1, 2, 0) == image).all()
print("OK", io.__name__)
"""


@pytest.mark.e2e  # a subprocess importing every command's modules (the quick loop leaves it out)
def test_nnunet_png_path_imports_and_reads_with_the_standin(tmp_path):
    """With the stand-in shadowing SimpleITK, every command's modules import and nnU-Net picks its PNG
    reader (never SimpleITK) for a PNG dataset and reads the image exactly."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN.parent), str(REPO_ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _DEVICE_IMPORTS, str(tmp_path / "case_0000.png")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK NaturalImage2DIO" in proc.stdout


def _fake_wheel(folder: Path, filename: str, requires) -> Path:
    name, version = filename.split("-")[:2]
    path = folder / filename
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)))
    return path


def test_check_wheels_flags_wrong_tags_and_unmet_requirements(prepare, tmp_path):
    good = _fake_wheel(tmp_path, "alpha-1.0-py3-none-any.whl",
                       ["numpy", "beta>=2", "SimpleITK>=2.2", "importlib-resources>=5; python_version < '3.12'",
                        "pytest; extra == 'test'"])
    beta = _fake_wheel(tmp_path, "beta-2.0-cp311-abi3-manylinux_2_17_x86_64.whl", [])
    assert prepare.check_wheels([good, beta], "3.12") == []
    # without beta, alpha's requirement is unmet; a cp313 or arm wheel does not fit CPython 3.12 x86-64
    wrong = _fake_wheel(tmp_path, "gamma-1.0-cp313-cp313-manylinux_2_17_x86_64.whl", [])
    arm = _fake_wheel(tmp_path, "delta-1.0-cp312-cp312-manylinux_2_17_aarch64.whl", ["zeta"])
    problems = prepare.check_wheels([good, wrong, arm], "3.12")
    assert len(problems) == 4, problems
    assert any("requires beta>=2" in p for p in problems)
    assert any(p.startswith("gamma-1.0") and "no tag" in p for p in problems)
    assert any(p.startswith("delta-1.0") and "no tag" in p for p in problems)
    assert any("requires zeta" in p for p in problems)
    # on Python 3.11 nibabel's importlib-resources marker applies: it is listed as not needed, so no problem
    assert prepare.check_wheels([good, beta], "3.11") == []


def test_resized_kvasir_copy_keeps_names_and_masks(prepare, tmp_path):
    src = tmp_path / "Kvasir-SEG"
    (src / "images").mkdir(parents=True)
    (src / "masks").mkdir()
    yy, xx = np.mgrid[:90, :120]
    mask = (((yy - 45) / 30.0) ** 2 + ((xx - 60) / 40.0) ** 2 < 1).astype(np.uint8) * 255
    for name in ("case_a", "case_b"):
        Image.fromarray(np.random.default_rng(1).integers(0, 255, (90, 120, 3), dtype=np.uint8)).save(
            src / "images" / f"{name}.jpg")
        Image.fromarray(np.stack([mask] * 3, -1)).save(src / "masks" / f"{name}.jpg", quality=95)
    assert prepare.write_resized_kvasir(src, tmp_path / "out", 32) == 2
    for name in ("case_a", "case_b"):
        with Image.open(tmp_path / "out" / "images" / f"{name}.jpg") as im:
            assert im.size == (32, 32) and im.mode == "RGB"
        with Image.open(tmp_path / "out" / "masks" / f"{name}.jpg") as m:
            small = np.asarray(m) > 127
        # the ellipse covers pi * 30 * 40 / (90 * 120) of the image
        assert abs(small.mean() - np.pi * 30 * 40 / (90 * 120)) < 0.03
    (src / "masks" / "case_b.jpg").unlink()
    with pytest.raises(SystemExit, match="case_b.jpg has no mask"):
        prepare.write_resized_kvasir(src, tmp_path / "out", 32)


def test_command_scripts_run_the_entry_points(device_run, tmp_path):
    commands = device_run.write_command_shims(tmp_path / "bin")
    for name in ("nnUNetv2_plan_and_preprocess", "nnUNetv2_train", "nnUNetv2_predict", "nnUNetv2_meddisseg_plan",
                 "nnUNetv2_meddisseg_convert", "nnUNetv2_meddisseg_compare"):
        assert name in commands and os.access(tmp_path / "bin" / name, os.X_OK)
    env = device_run.child_environment(tmp_path / "bin", tiny=True)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT) or str(REPO_ROOT) in env["PYTHONPATH"]
    assert env["PATH"].startswith(str(tmp_path / "bin")) and env["nnUNet_compile"] == "f"
    proc = subprocess.run([str(tmp_path / "bin" / "nnUNetv2_meddisseg_convert"), "--help"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "kvasir-seg" in proc.stdout


def test_cli_split_takes_the_first_shipped_cases(device_run, tmp_path):
    shipped = json.loads(device_run.SHIPPED_SPLIT.read_text())
    split = device_run.write_cli_split(tmp_path / "split.json", (3, 1, 2))
    assert json.loads((tmp_path / "split.json").read_text()) == split
    assert split["train"] == shipped["train"][:3] and split["val"] == shipped["val"][:1]
    assert split["test"] == shipped["test"][:2]


@pytest.mark.parametrize("steps, capped, uncapped", [
    (["environment", "throughput", "training", "cli", "quality"], ["environment", "throughput", "training", "cli"],
     "quality"),
    (["cli"], [], "cli"),
    (["environment", "cli"], ["environment"], "cli"),
])
def test_last_selected_step_takes_the_time_left(device_run, tmp_path, steps, capped, uncapped):
    args = device_run._parser().parse_args([str(tmp_path / "out"), "--steps", *steps, "--budget-s", "540",
                                            "--scratch", str(tmp_path / "scratch")])
    run = device_run.DeviceRun(args)
    for name in capped:
        assert run.cap(name) == device_run.MODES["full"]["caps"][name]
    assert run.cap(uncapped) == float("inf")
    timeouts = device_run.MODES["full"]["cli_timeouts"]
    cap_end = device_run.time.monotonic() + run.cap("cli")
    train = run.cli_timeout("train", cap_end)
    if uncapped == "cli":
        # training may use everything but prediction's share of the 540 s
        assert 540 - timeouts["predict"] - 5 < train <= 540 - timeouts["predict"]
    else:
        assert train == pytest.approx(min(timeouts["train"], run.cap("cli")), abs=1)
    assert run.cli_timeout("predict", cap_end) == timeouts["predict"]


def test_pace_step_keeps_its_cap_and_budget(device_run, tmp_path):
    args = device_run._parser().parse_args([str(tmp_path / "out"), "--steps", "pace", "--scratch",
                                            str(tmp_path / "scratch")])
    run = device_run.DeviceRun(args)
    cap = device_run.MODES["full"]["caps"]["pace"]
    assert cap <= 480 and run.cap("pace") == cap  # the last step, yet time-boxed
    assert cap < run.remaining() <= cap + 10
    assert "pace" not in device_run._parser().parse_args([str(tmp_path / "o")]).steps  # only when named
    timeouts = device_run.MODES["full"]["pace"]["timeouts"]
    assert device_run.MODES["full"]["pace"]["probe"] + sum(timeouts.values()) <= cap


def test_pace_budget_is_a_recipe_override_file_the_trainers_accept(device_run, tmp_path):
    import json

    from nnunetv2_meddisseg.training.recipe import RECIPE_ENVIRONMENT_VARIABLE, apply_overrides
    from nnunetv2_meddisseg.training.variants import nnUNetTrainerBaseline, nnUNetTrainerMedDisSeg

    assert device_run.RECIPE_VARIABLE == RECIPE_ENVIRONMENT_VARIABLE
    target = device_run.write_pace_budget(tmp_path / "pace_budget.json", 50)
    overrides = json.loads(target.read_text())
    assert device_run.PACE_TRAINERS == (nnUNetTrainerMedDisSeg.__name__, nnUNetTrainerBaseline.__name__)
    for cls in (nnUNetTrainerMedDisSeg, nnUNetTrainerBaseline):
        recipe = apply_overrides(cls.recipe, overrides, str(target))
        assert (recipe.num_epochs, recipe.iterations_per_epoch, recipe.final_validation) == (2, 50, False)


@pytest.mark.e2e  # profiles the whole network (the quick loop leaves it out)
def test_pace_probe_on_the_cpu(tmp_path):
    """pace.py's profiles and timings at 32x32 on the CPU (no compile): the previous implementations
    issue more operations than the current ones, and every variant is timed."""
    pace = _load("device_pace", DEVICE_DIR / "pace.py")
    out = tmp_path / "pace.json"
    assert pace.main([str(out), "--device", "cpu", "--size", "32", "--batch", "2", "--infer-batches", "2",
                      "--repeats", "1", "--no-compile", "--threads", "1", "--budget-s", "3000"]) == 0
    result = json.loads(out.read_text())
    assert result["skipped"] == {}
    launches = {(p["what"], p["implementations"]): p["launches"] for p in result["profiles"]}
    assert set(launches) == {(w, i) for w in ("training_step", "inference") for i in ("previous", "current")}
    for what in ("training_step", "inference"):
        assert 0 < launches[(what, "current")] < launches[(what, "previous")]
    assert all(p["top"] and p["unit"].endswith("(CPU)") for p in result["profiles"])
    timed = {(r["what"], r["variant"]) for r in result["throughput"]}
    assert timed == {(w, v) for w in ("training_step", "inference") for v in ("fp32", "bf16")}
    assert all(r["images_per_s"] > 0 for r in result["throughput"])
