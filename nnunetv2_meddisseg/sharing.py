"""``nnUNetv2_meddisseg_weights_only``: a copy of a trained model folder for sharing, its checkpoints
reduced to what prediction reads.

    nnUNetv2_meddisseg_weights_only MODEL_FOLDER OUTPUT_FOLDER

nnU-Net's checkpoints hold the optimizer's state for ``--c``; with Adam a checkpoint is about three times its
weights (Med-DisSeg: about 550 MB, 180 MB of weights). The copy's checkpoints hold only ``PREDICTION_KEYS``, all
that prediction and ``-pretrained_weights`` read (training cannot resume from them), written anew from a
weights-only read (``torch_files``): a checkpoint whose pickle would run code is refused, never run. To share, run
``nnUNetv2_export_model_to_zip`` on a results tree holding the copy.
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import torch

from nnunetv2_meddisseg.cli import DefaultsHelpFormatter, run_command
from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.files import is_inside, replace_folder, temporary_sibling
from nnunetv2_meddisseg.torch_files import PREDICTOR_KEYS, read_checkpoint

__all__ = ["PREDICTION_KEYS", "weights_only_checkpoint", "copy_weights_only", "main"]

#: what nnU-Net's predictor reads from a checkpoint (and ``current_epoch``, which says what was trained)
PREDICTION_KEYS = ("network_weights", "trainer_name", "init_args", "inference_allowed_mirroring_axes",
                   "current_epoch")
PROG = "nnUNetv2_meddisseg_weights_only"
#: files a share never carries: temporaries of interrupted writes (``checkpoint_*.pth.<pid>.tmp``, ...)
TEMPORARY_SUFFIXES = (".tmp", ".partial")


def weights_only_checkpoint(checkpoint: Mapping[str, object], source: str = "checkpoint") -> Dict[str, object]:
    """The ``PREDICTION_KEYS`` of ``checkpoint``; an error naming ``source`` where the predictor's keys are missing."""
    missing = [k for k in PREDICTOR_KEYS if k not in checkpoint]
    if missing:
        raise UserError(f"{source} is not an nnU-Net checkpoint: it has no {', '.join(missing)}")
    return {k: checkpoint[k] for k in PREDICTION_KEYS if k in checkpoint}


def copy_weights_only(model_folder: Path, output_folder: Path) -> List[Path]:
    """Copy ``model_folder`` to ``output_folder`` (new or empty, not inside ``model_folder``) without temporary files,
    every ``checkpoint_*.pth`` reduced by ``weights_only_checkpoint``; returns the reduced checkpoints. All are read
    before the copy is written to a hidden sibling and renamed into place, so a failure leaves no output behind."""
    model_folder, output_folder = Path(model_folder), Path(output_folder)
    if not (model_folder / "plans.json").is_file() or not list(model_folder.glob("fold_*")):
        raise UserError(f"{model_folder} is not a trained nnU-Net model folder: expected plans.json and fold_* "
                        f"folders (<trainer>__<plans>__<configuration> under $nnUNet_results/<dataset>)")
    if is_inside(output_folder, model_folder) or is_inside(model_folder, output_folder):
        raise UserError(f"OUTPUT_FOLDER {output_folder} is inside MODEL_FOLDER {model_folder} (or holds it): choose "
                        f"a folder outside the model folder")
    if output_folder.exists() and (not output_folder.is_dir() or any(output_folder.iterdir())):
        raise UserError(f"{output_folder} exists and is not an empty folder: choose a new OUTPUT_FOLDER")
    checkpoints = sorted(model_folder.glob("fold_*/checkpoint_*.pth"))
    if not checkpoints:
        raise UserError(f"{model_folder} holds no fold_*/checkpoint_*.pth: train the model first")
    reduced = {path.relative_to(model_folder): weights_only_checkpoint(read_checkpoint(path), str(path))
               for path in checkpoints}
    target = output_folder.resolve()
    partial = None
    try:
        partial = temporary_sibling(target, folder=True)
        shutil.copytree(model_folder, partial, ignore=_not_shared, dirs_exist_ok=True)
        for relative, checkpoint in reduced.items():
            _save(checkpoint, partial / relative)
        if target.is_dir():
            target.rmdir()  # empty when checked; one that has gained files since stays, and the copy is refused
        replace_folder(partial, target)
    except BaseException as e:
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write the copy {output_folder}: {_os_error(e)}") from None
        raise
    return [output_folder / relative for relative in reduced]


def _save(checkpoint: Mapping[str, object], path: Path) -> None:
    """``torch.save`` through memory, so that a failed write is the OSError naming ``path`` and its cause
    (torch's own writer reports a full disk as a RuntimeError without either)."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    with open(path, "wb") as f:
        f.write(buffer.getbuffer())


def _not_shared(folder: str, names: List[str]) -> List[str]:
    """``shutil.copytree``'s ignore: checkpoints (written reduced) and temporary files."""
    return [n for n in names if (n.startswith("checkpoint_") and n.endswith(".pth")) or n.endswith(TEMPORARY_SUFFIXES)]


def _os_error(e: OSError) -> str:
    """``<path>: <strerror>`` of an OSError (shutil.Error: its first failure)."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        source, destination, why = e.args[0][0]
        return f"{destination}: {why}"
    return f"{e.filename}: {e.strerror or e}" if e.filename else (e.strerror or str(e))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, formatter_class=DefaultsHelpFormatter,
                                description="Copy a trained nnU-Net model folder for sharing, with checkpoints "
                                            "that hold only what prediction reads (no optimizer state).")
    p.add_argument("model_folder", type=Path, help="trainer output folder <trainer>__<plans>__<configuration>")
    p.add_argument("output_folder", type=Path, help="new (or empty) folder for the copy")
    return p


def _command(argv: Optional[Sequence[str]]) -> None:
    args = _parser().parse_args(argv)
    for path in copy_weights_only(args.model_folder, args.output_folder):
        source = args.model_folder / path.relative_to(args.output_folder)
        print(f"{path}: {path.stat().st_size / 1e6:.0f} MB (was {source.stat().st_size / 1e6:.0f} MB)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_command(PROG, _command, argv)


if __name__ == "__main__":
    sys.exit(main())
