"""An offline bundle for an air-gapped GPU machine: the wheels this package needs beyond PyTorch, and data.

``prepare`` (where the network is reachable) writes ``wheels/`` (this package and every distribution it needs
beyond ``--provided``, pinned to the versions installed here, for CPython ``--python-version`` on x86-64 Linux),
``data/Kvasir-SEG/`` (resized to ``--size``; ``--no-data`` skips it) and ``INSTALL.txt``; ``check`` verifies the
wheels' tags and requirements. How to install on the target: benchmarks/README.md.
"""
import argparse
import os
import re
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = REPO_ROOT / ".offline_bundle"
#: what a GPU machine with PyTorch is assumed to have (normalised distribution names)
PROVIDED = ("torch", "torchvision", "triton", "numpy", "pillow")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")
INSTALL = ("On the machine without network access (Python with PyTorch), then see benchmarks/README.md:\n"
           "    python -m pip install --no-index --find-links {wheels} nnunetv2_meddisseg\n"
           "    export NNUNETV2_MEDDISSEG_TEST_DATA={data}\n")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _target_environment(python_version: str) -> Dict[str, str]:
    """Marker values of CPython ``python_version`` on x86-64 Linux (for evaluating requirement markers)."""
    return {"python_version": python_version, "python_full_version": python_version + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def required_distributions(root: str, provided: Iterable[str], python_version: str) -> Dict[str, str]:
    """``{name: installed version}`` of ``root``'s requirements and theirs, as installed in this environment,
    without extras and stopping at ``provided``; ``root`` itself is not included."""
    from packaging.requirements import Requirement

    env, stop = _target_environment(python_version), {normalise(n) for n in provided}
    found: Dict[str, str] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} is not installed in this environment ({sys.executable}): install "
                             f"nnunetv2_meddisseg with its requirements first") from None
        for line in dist.requires or []:
            req = Requirement(line)
            n = normalise(req.name)
            if (req.marker is not None and not req.marker.evaluate(env)) or n in stop or n in found:
                continue
            try:
                found[n] = distribution(req.name).version
            except PackageNotFoundError:
                raise SystemExit(f"{req.name} (required by {name}) is not installed here: install it first") from None
            todo.append(req.name)
    found.pop(normalise(root), None)
    return found


def _pip(args: Sequence[str], log: Path) -> int:
    """``python -m pip ARGS`` with its output appended to ``log``; its exit code."""
    from nnunetv2_meddisseg.logged_command import run_logged_status

    return run_logged_status(["python", "-m", "pip", *args], os.environ, log, echo=False, append=True)[0]


def download_wheels(target: Path, python_version: str, pins: Sequence[str]) -> List[Path]:
    """The wheels of ``pins`` for CPython ``python_version`` on x86-64 Linux in ``target`` (emptied of older
    wheels first), plus a wheel of this package: ``pip download`` of a published wheel, else ``pip wheel`` of
    its source, accepted only if pure Python."""
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.whl"):
        old.unlink()
    download = ["download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
                "--implementation", "cp", "-d", str(target)]
    for platform in PLATFORMS:
        download += ["--platform", platform]
    log = target.parent / "pip.log"
    print(f"downloading {len(pins)} wheels for CPython {python_version} (x86-64 Linux) into {target} (log: {log})",
          flush=True)
    for pin in pins:
        before = set(target.glob("*.whl"))
        if _pip(download + [pin], log) != 0:
            built = _pip(["wheel", "--quiet", "--no-deps", "-w", str(target), pin], log)
            new = set(target.glob("*.whl")) - before
            if built != 0 or len(new) != 1 or not new.pop().name.endswith("-none-any.whl"):
                raise SystemExit(f"{pin}: no wheel for CPython {python_version} x86-64 Linux, and no pure-Python "
                                 f"wheel could be built from its source")
            print(f"  {pin}: built from source (pure Python)")
    if _pip(["wheel", "--quiet", "--no-deps", "-w", str(target), str(REPO_ROOT)], log) != 0:
        raise SystemExit(f"building the wheel of this package failed: {log.read_text().strip().splitlines()[-1]} "
                         f"(full log: {log})")
    return sorted(target.glob("*.whl"))


def check_wheels(wheels: Sequence[Path], python_version: str, provided: Iterable[str]) -> List[str]:
    """Problems of ``wheels`` for CPython ``python_version`` on x86-64 Linux: a tag that does not fit, or a
    requirement (markers evaluated for that Python) that is neither in the bundle nor provided. Empty when
    all is well."""
    from packaging.requirements import Requirement
    from packaging.utils import parse_wheel_filename

    cp = "cp" + python_version.replace(".", "")
    names, problems, requirements = set(), [], []
    for wheel in wheels:
        name, _, _, tags = parse_wheel_filename(wheel.name)
        names.add(normalise(str(name)))
        if not any((t.interpreter in (cp, "py3", "py2.py3") or (t.abi == "abi3" and t.interpreter <= cp))
                   and (t.platform == "any" or t.platform.endswith("x86_64") and t.platform.startswith("manylinux"))
                   for t in tags):
            problems.append(f"{wheel.name}: no tag for {cp} on manylinux x86_64")
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            requirements += [(wheel.name, Requirement(line.split(":", 1)[1].strip()))
                             for line in z.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")]
    env, provided = _target_environment(python_version), {normalise(n) for n in provided}
    for wheel, req in requirements:
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if normalise(req.name) not in names | provided:
            problems.append(f"{wheel}: requires {req}, which is neither in the bundle nor provided")
    return problems


def write_resized_kvasir(source: Path, target: Path, size: int, quality: int = 90) -> int:
    """Copy Kvasir-SEG's ``images/`` and ``masks/`` from ``source`` to ``target`` resized to size x size
    (images bilinear, masks nearest, JPEG of ``quality``; masks at 95), keeping the file names. Returns the
    number of image/mask pairs written."""
    from PIL import Image

    source, target = Path(source), Path(target)
    if not (source / "images").is_dir() or not (source / "masks").is_dir():
        raise SystemExit(f"--kvasir {source}: expected a Kvasir-SEG folder with images/ and masks/")
    images = sorted(p for p in (source / "images").iterdir() if p.suffix.lower() in (".jpg", ".jpeg"))
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("command", choices=("prepare", "check"), help="write the bundle, or check its wheels")
    p.add_argument("--bundle", default=str(DEFAULT_BUNDLE), help="the bundle folder")
    p.add_argument("--python-version", default="3.12", help="CPython version of the target machine")
    p.add_argument("--provided", nargs="+", default=list(PROVIDED),
                   help="distributions the target machine already has (with their own dependencies)")
    p.add_argument("--kvasir", default=None,
                   help="Kvasir-SEG folder (images/, masks/); default: $NNUNETV2_MEDDISSEG_TEST_DATA/Kvasir-SEG")
    p.add_argument("--size", type=int, default=256, help="images and masks resized to SIZE x SIZE")
    p.add_argument("--no-data", action="store_true", help="wheels only")
    args = p.parse_args(argv)
    bundle = Path(args.bundle).resolve()
    wheels_dir, data_dir = bundle / "wheels", bundle / "data"

    if args.command == "prepare":
        pins = [f"{n}=={v}" for n, v in sorted(required_distributions("nnunetv2_meddisseg", args.provided,
                                                                      args.python_version).items())]
        for w in download_wheels(wheels_dir, args.python_version, pins):
            print(f"  {w.name}  {w.stat().st_size / 2 ** 20:.2f} MiB")
        if not args.no_data:
            root = os.environ.get("NNUNETV2_MEDDISSEG_TEST_DATA")
            kvasir = Path(args.kvasir) if args.kvasir else Path(root) / "Kvasir-SEG" if root else None
            if kvasir is None:
                raise SystemExit("no Kvasir-SEG folder: pass --kvasir PATH or set NNUNETV2_MEDDISSEG_TEST_DATA "
                                 "(or --no-data)")
            n = write_resized_kvasir(kvasir, data_dir / "Kvasir-SEG", args.size)
            print(f"wrote {n} image/mask pairs at {args.size}x{args.size} into {data_dir / 'Kvasir-SEG'}")
        (bundle / "INSTALL.txt").write_text(INSTALL.format(wheels=wheels_dir, data=data_dir))
    problems = check_wheels(sorted(wheels_dir.glob("*.whl")), args.python_version, args.provided)
    for problem in problems:
        print(f"WHEEL PROBLEM: {problem}", file=sys.stderr)
    if problems:
        return 1
    mib = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file()) / 2 ** 20
    print(f"bundle {bundle} ({mib:.1f} MiB): wheel tags fit CPython {args.python_version} x86-64 "
          f"Linux; every requirement is in the bundle or provided ({', '.join(args.provided)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
