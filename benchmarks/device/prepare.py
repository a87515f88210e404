"""Prepare the device run (``benchmarks/device/run.py``) for a GPU machine that cannot download anything.

Run it beforehand, on a machine with internet access and this package's environment. It writes two
folders into the repository, both ignored by git and both meant to travel with the working tree:

- ``.device_wheels/``: the wheels of the packages the run needs beyond what such a machine ships
  (CPython ``--python-version`` on manylinux x86-64 or pure Python), each pinned to the version
  installed in this environment (``pip download --no-deps --only-binary=:all:``). SimpleITK (a wheel
  of about 50 MB) is not among them: the run puts a stand-in module (``benchmarks/device/standins``)
  on the path instead, enough for the PNG datasets it uses.
- ``.device_data/Kvasir-SEG/``: Kvasir-SEG resized to ``--size`` (images bilinear, masks nearest,
  both JPEG under their original names in ``images/`` and ``masks/``), so that
  ``nnUNetv2_meddisseg_convert kvasir-seg`` reads it unchanged.

Finally it prints the size of everything that travels (the files git tracks, the untracked files
git does not ignore, and both folders) and exits with 1 if it exceeds ``--limit-mib``.

Usage: ``python benchmarks/device/prepare.py [--kvasir PATH] [--size 256] [--python-version 3.12]``
"""
import argparse
import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEELS_DIR = REPO_ROOT / ".device_wheels"
DATA_DIR = REPO_ROOT / ".device_data"
LIMIT_MIB = 64.0

#: Distributions the run imports (nnUNetv2_plan_and_preprocess, nnUNetv2_train, nnUNetv2_predict and
#: this package's commands on 2D PNG data) that a GPU machine with PyTorch, torchvision, timm, scipy,
#: scikit-image, scikit-learn, matplotlib, pandas, pillow, seaborn, tifffile, imageio, requests and
#: their dependencies does not have. Not carried: SimpleITK (stand-in), and nnunetv2's requirements
#: that these code paths never import (graphviz, yacs, imagecodecs: tifffile falls back without it).
CARRIED = (
    "nnunetv2",
    "dynamic-network-architectures",
    "batchgenerators",
    "batchgeneratorsv2",
    "acvl-utils",
    "connected-components-3d",  # acvl_utils.morphology
    "blosc2",  # nnU-Net's preprocessed data format
    "ndindex",  # blosc2
    "msgpack",  # blosc2
    "numexpr",  # blosc2
    "httpx",  # imported by blosc2 at import time (its remote arrays); its own imports are lazy
    "nibabel",  # nnunetv2.imageio registers its NIfTI readers at import time
)

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")


def pinned_requirements(names: Iterable[str] = CARRIED) -> List[str]:
    """``NAME==VERSION`` of each distribution as installed in this environment."""
    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            raise SystemExit(f"{name} is not installed in this environment ({sys.executable}): install "
                             f"nnunetv2_meddisseg with its requirements first") from None
    return pins


def _pip(args: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def download_wheels(target: Path, python_version: str, pins: Sequence[str]) -> List[Path]:
    """The wheels of ``pins`` for CPython ``python_version`` on x86-64 Linux in ``target`` (emptied first
    of other wheels): ``pip download`` of a published wheel, else (a package published as source only)
    ``pip wheel`` of its source, accepted only if pure Python."""
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.whl"):
        old.unlink()
    download = ["download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                "--implementation", "cp", "-d", str(target)]
    for platform in PLATFORMS:
        download += ["--platform", platform]
    print(f"downloading {len(pins)} wheels for CPython {python_version} (x86-64 Linux) into {target}", flush=True)
    for pin in pins:
        before = set(target.glob("*.whl"))
        if _pip(download + [pin]).returncode != 0:
            built = _pip(["wheel", "--quiet", "--no-deps", "-w", str(target), pin])
            new = set(target.glob("*.whl")) - before
            if built.returncode != 0 or len(new) != 1:
                raise SystemExit(f"{pin}: no wheel for CPython {python_version} x86-64 Linux and building one from "
                                 f"source failed: {(built.stderr.strip().splitlines() or ['?'])[-1]}")
            if not new.pop().name.endswith("-none-any.whl"):
                raise SystemExit(f"{pin}: published as source only and not pure Python; cannot build it for "
                                 f"CPython {python_version} here")
            print(f"  {pin}: built from source (pure Python)")
    wheels = sorted(target.glob("*.whl"))
    if len(wheels) != len(pins):
        raise SystemExit(f"expected {len(pins)} wheels in {target}, found {len(wheels)}")
    return wheels


#: what the GPU machine has: the packages it ships and their dependencies (normalised names)
DEVICE_PROVIDES = frozenset("""
torch torchvision triton timm scipy scikit-image scikit-learn matplotlib pandas pillow numpy einops tqdm requests
imageio tifffile seaborn h5py pyyaml psutil opencv-python-headless filelock typing-extensions sympy mpmath networkx
jinja2 markupsafe fsspec huggingface-hub safetensors packaging lazy-loader joblib threadpoolctl contourpy cycler
fonttools kiwisolver pyparsing python-dateutil six pytz tzdata charset-normalizer idna urllib3 certifi setuptools
""".split())
#: requirements of carried wheels that the run never imports (or replaces), with the reason
NOT_NEEDED = {
    "simpleitk": "stand-in module (benchmarks/device/standins)",
    "graphviz": "network plots only, never imported on the run's code paths",
    "yacs": "never imported on the run's code paths",
    "imagecodecs": "optional for tifffile; the run reads PNG/JPEG",
    "future": "never imported on the run's code paths",
    "unittest2": "never imported on the run's code paths",
    "pydantic": "blosc2 schemas, imported lazily",
    "rich": "httpx's command line, imported lazily",
    "httpcore": "httpx transports, imported lazily",
    "anyio": "httpx transports, imported lazily",
    "sniffio": "httpx transports, imported lazily",
    "importlib-resources": "nibabel on Python < 3.12 only",
}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheels(wheels: Sequence[Path], python_version: str) -> List[str]:
    """Problems of ``wheels`` for CPython ``python_version`` on x86-64 Linux: a tag that does not fit, or a
    requirement (markers evaluated for that Python) that neither the GPU machine, another wheel nor
    :data:`NOT_NEEDED` covers. Empty when all is well."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    cp = "cp" + python_version.replace(".", "")
    names, problems, requirements = set(), [], []
    for wheel in wheels:
        name, _, _, tags = parse_wheel_filename(wheel.name)
        names.add(_normalise(str(name)))
        if not any((t.interpreter in (cp, "py3", "py2.py3") or (t.abi == "abi3" and t.interpreter <= cp))
                   and (t.platform == "any" or t.platform.endswith("x86_64") and t.platform.startswith("manylinux"))
                   for t in tags):
            problems.append(f"{wheel.name}: no tag for {cp} on manylinux x86_64")
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            requirements += [(wheel.name, Requirement(line.split(":", 1)[1].strip()))
                             for line in z.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    env = {"python_version": python_version, "python_full_version": python_version + ".0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    for wheel, req in requirements:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        n = _normalise(req.name)
        if n not in names and n not in DEVICE_PROVIDES and n not in NOT_NEEDED:
            problems.append(f"{wheel}: requires {req}, which is neither on the GPU machine nor carried")
    return problems


def _jpeg_files(folder: Path) -> List[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg"))


def write_resized_kvasir(source: Path, target: Path, size: int, quality: int = 90) -> int:
    """Copy Kvasir-SEG's ``images/`` and ``masks/`` from ``source`` to ``target`` resized to size x size
    (images bilinear, masks nearest, JPEG of ``quality``; masks at 95), keeping the file names. Returns the
    number of image/mask pairs written."""
    from PIL import Image

    source, target = Path(source), Path(target)
    if not (source / "images").is_dir() or not (source / "masks").is_dir():
        raise SystemExit(f"--kvasir {source}: expected a Kvasir-SEG folder with images/ and masks/")
    images = _jpeg_files(source / "images")
    if not images:
        raise SystemExit(f"--kvasir {source}: no .jpg images in {source / 'images'}")
    for sub in ("images", "masks"):
        (target / sub).mkdir(parents=True, exist_ok=True)
        for old in (target / sub).iterdir():
            old.unlink()
    for image_file in images:
        mask_file = source / "masks" / image_file.name
        if not mask_file.is_file():
            raise SystemExit(f"--kvasir {source}: image {image_file.name} has no mask {mask_file}")
        with Image.open(image_file) as im:
            im.convert("RGB").resize((size, size), Image.BILINEAR).save(
                target / "images" / image_file.name, quality=quality)
        with Image.open(mask_file) as m:
            m.convert("L").resize((size, size), Image.NEAREST).save(target / "masks" / image_file.name, quality=95)
    return len(images)


def _git_files(*extra: str) -> List[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *extra], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    return [REPO_ROOT / f for f in out.decode().split("\0") if f]


def travelling_bytes(folders: Sequence[Path]) -> dict:
    """Bytes of the tracked files, the untracked files git does not ignore, and each folder in ``folders``."""
    def size(paths: Iterable[Path]) -> int:
        return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())

    result = {"tracked": size(_git_files()), "untracked": size(_git_files("--others", "--exclude-standard"))}
    for folder in folders:
        result[str(folder.relative_to(REPO_ROOT))] = size(folder.rglob("*")) if folder.is_dir() else 0
    return result


def _default_kvasir() -> Optional[Path]:
    root = os.environ.get("NNUNETV2_MEDDISSEG_TEST_DATA")
    return Path(root) / "Kvasir-SEG" if root else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kvasir", default=None, help="Kvasir-SEG folder (images/, masks/); default: "
                   "$NNUNETV2_MEDDISSEG_TEST_DATA/Kvasir-SEG")
    p.add_argument("--size", type=int, default=256, help="images and masks resized to SIZE x SIZE")
    p.add_argument("--python-version", default="3.12", help="CPython version of the GPU machine")
    p.add_argument("--wheels", default=str(WHEELS_DIR), help="folder for the wheels")
    p.add_argument("--data", default=str(DATA_DIR), help="folder for the resized Kvasir-SEG (DATA/Kvasir-SEG)")
    p.add_argument("--skip-wheels", action="store_true")
    p.add_argument("--skip-data", action="store_true")
    p.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="most MiB that may travel")
    args = p.parse_args(argv)
    wheels_dir, data_dir = Path(args.wheels).resolve(), Path(args.data).resolve()

    if not args.skip_wheels:
        for w in download_wheels(wheels_dir, args.python_version, pinned_requirements()):
            print(f"  {w.name}  {w.stat().st_size / 2 ** 20:.2f} MiB")
    problems = check_wheels(sorted(wheels_dir.glob("*.whl")), args.python_version)
    for problem in problems:
        print(f"WHEEL PROBLEM: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"wheels checked: tags fit CPython {args.python_version} x86-64 Linux; every requirement is on the GPU "
          f"machine, carried, or not needed")
    if not args.skip_data:
        kvasir = Path(args.kvasir) if args.kvasir else _default_kvasir()
        if kvasir is None:
            raise SystemExit("no Kvasir-SEG folder: pass --kvasir PATH or set NNUNETV2_MEDDISSEG_TEST_DATA")
        n = write_resized_kvasir(kvasir, data_dir / "Kvasir-SEG", args.size)
        print(f"wrote {n} image/mask pairs at {args.size}x{args.size} into {data_dir / 'Kvasir-SEG'}")

    folders = [f for f in (wheels_dir, data_dir) if REPO_ROOT in f.parents]
    sizes = travelling_bytes(folders)
    total = sum(sizes.values())
    for name, b in sizes.items():
        print(f"  {name}: {b / 2 ** 20:.2f} MiB")
    print(f"total travelling with the working tree: {total / 2 ** 20:.2f} MiB (limit {args.limit_mib:g} MiB)")
    if total > args.limit_mib * 2 ** 20:
        print(f"TOO LARGE: {total / 2 ** 20:.2f} MiB > {args.limit_mib:g} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
