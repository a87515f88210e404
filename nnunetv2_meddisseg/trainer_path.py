"""Where nnU-Net finds our trainers: ``export nnUNet_extTrainer=$(python -m nnunetv2_meddisseg.trainer_path)``.

nnU-Net (>= 2.8.0) searches the folders of ``nnUNet_extTrainer`` for trainers it does not ship; this prints ours.
"""
import argparse
import inspect
from typing import Dict, Optional, Sequence

from nnunetv2_meddisseg.environment import trainer_folder, trainer_search_path

__all__ = ["catalogue", "main"]


def _summary(cls: type, width: int = 110) -> str:
    """The first sentence of a class's docstring, on one line, cut after ``width`` characters."""
    paragraph = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split()).replace("``", "")
    end = paragraph.find(". ")
    sentence = paragraph[:end + 1] if end >= 0 else paragraph
    return sentence if len(sentence) <= width else sentence[:width].rsplit(" ", 1)[0] + " ..."


def catalogue() -> Dict[str, str]:
    """``{trainer class name: what it is}`` for every trainer nnU-Net finds in ``environment.TRAINER_FOLDER``."""
    from nnunetv2_meddisseg.nnunet_trainers import meddisseg_trainers

    return {name: _summary(getattr(meddisseg_trainers, name)) for name in meddisseg_trainers.__all__}


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m nnunetv2_meddisseg.trainer_path", description=__doc__.split("\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--list", action="store_true", help="print every trainer, one line each (name: what it is)")
    group.add_argument("--search_path", action="store_true",
                       help="print this folder followed by the folders already in nnUNet_extTrainer")
    args = p.parse_args(argv)
    if args.list:
        for name, summary in catalogue().items():
            print(f"{name}: {summary}")
    elif args.search_path:
        print(trainer_search_path())
    else:
        print(trainer_folder())


if __name__ == "__main__":
    main()
