"""benchmarks/offline_bundle.py without network access: the requirements it follows, the wheel check and the
resized Kvasir-SEG copy."""
import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

BUNDLE_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "offline_bundle.py"
PROVIDED = ["numpy", "SimpleITK"]


@pytest.fixture(scope="module")
def bundle():
    spec = importlib.util.spec_from_file_location("offline_bundle", BUNDLE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requirements_follow_the_installed_metadata_and_stop_at_what_is_provided(bundle):
    found = bundle.required_distributions("nnunetv2_meddisseg", bundle.PROVIDED, "3.12")
    assert {"nnunetv2", "dynamic-network-architectures", "batchgeneratorsv2", "simpleitk", "blosc2"} <= set(found)
    assert not {"torch", "numpy", "nnunetv2-meddisseg"} & set(found)
    assert all(version[0].isdigit() for version in found.values())


def _fake_wheel(folder: Path, filename: str, requires) -> Path:
    name, version = filename.split("-")[:2]
    path = folder / filename
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)))
    return path


def test_check_wheels_flags_wrong_tags_and_unmet_requirements(bundle, tmp_path):
    good = _fake_wheel(tmp_path, "alpha-1.0-py3-none-any.whl",
                       ["numpy", "beta>=2", "SimpleITK>=2.2", "importlib-resources>=5; python_version < '3.12'",
                        "pytest; extra == 'test'"])
    beta = _fake_wheel(tmp_path, "beta-2.0-cp311-abi3-manylinux_2_17_x86_64.whl", [])
    assert bundle.check_wheels([good, beta], "3.12", PROVIDED) == []
    # without beta, alpha's requirement is unmet; a cp313 or arm wheel does not fit CPython 3.12 x86-64
    wrong = _fake_wheel(tmp_path, "gamma-1.0-cp313-cp313-manylinux_2_17_x86_64.whl", [])
    arm = _fake_wheel(tmp_path, "delta-1.0-cp312-cp312-manylinux_2_17_aarch64.whl", ["zeta"])
    problems = bundle.check_wheels([good, wrong, arm], "3.12", PROVIDED)
    assert len(problems) == 4, problems
    assert any("requires beta>=2" in p for p in problems)
    assert any(p.startswith("gamma-1.0") and "no tag" in p for p in problems)
    assert any(p.startswith("delta-1.0") and "no tag" in p for p in problems)
    assert any("requires zeta" in p for p in problems)
    # on Python 3.11 the importlib-resources marker applies: neither in the bundle nor provided
    assert [p for p in bundle.check_wheels([good, beta], "3.11", PROVIDED) if "importlib-resources" in p]
    assert bundle.check_wheels([good, beta], "3.11", PROVIDED + ["importlib-resources"]) == []


def test_resized_kvasir_copy_keeps_names_and_masks(bundle, tmp_path):
    src = tmp_path / "Kvasir-SEG"
    (src / "images").mkdir(parents=True)
    (src / "masks").mkdir()
    yy, xx = np.mgrid[:90, :120]
    mask = (((yy - 45) / 30.0) ** 2 + ((xx - 60) / 40.0) ** 2 < 1).astype(np.uint8) * 255
    for name in ("case_a", "case_b"):
        Image.fromarray(np.random.default_rng(1).integers(0, 255, (90, 120, 3), dtype=np.uint8)).save(
            src / "images" / f"{name}.jpg")
        Image.fromarray(np.stack([mask] * 3, -1)).save(src / "masks" / f"{name}.jpg", quality=95)
    assert bundle.write_resized_kvasir(src, tmp_path / "out", 32) == 2
    for name in ("case_a", "case_b"):
        with Image.open(tmp_path / "out" / "images" / f"{name}.jpg") as im:
            assert im.size == (32, 32) and im.mode == "RGB"
        with Image.open(tmp_path / "out" / "masks" / f"{name}.jpg") as m:
            small = np.asarray(m) > 127
        # the ellipse covers pi * 30 * 40 / (90 * 120) of the image
        assert abs(small.mean() - np.pi * 30 * 40 / (90 * 120)) < 0.03
    (src / "masks" / "case_b.jpg").unlink()
    with pytest.raises(SystemExit, match="case_b.jpg has no mask"):
        bundle.write_resized_kvasir(src, tmp_path / "out", 32)
