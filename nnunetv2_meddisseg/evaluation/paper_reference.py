"""The paper's Med-DisSeg results (the shipped ``paper_results.json``) and how a dataset name finds its entry."""
import json
import os
import re
from typing import Dict, Optional, Tuple

__all__ = ["PAPER_RESULTS_FILE", "normalise_name", "organ_key", "load_paper_results", "paper_reference"]

PAPER_RESULTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_results.json")


def normalise_name(name: str) -> str:
    """Lower-case alphanumerics without an nnU-Net ``DatasetXXX_`` prefix: 'Dataset501_Kvasir-SEG' -> 'kvasirseg'."""
    name = re.sub(r"^Dataset\d{3}_", "", str(name))
    return re.sub(r"[^0-9a-z]", "", name.lower())


def organ_key(name: str) -> Tuple[str, str]:
    """(joined words, sorted joined words) of an organ name: 'kidney_left' and 'left kidney' share the second."""
    tokens = [t for t in re.split(r"[^0-9a-z]+", name.lower()) if t]
    return "".join(tokens), "".join(sorted(tokens))


def load_paper_results(path: str = PAPER_RESULTS_FILE) -> Dict[str, dict]:
    """The paper's Med-DisSeg results, ``{dataset key: {"metrics": {metric: percent}, ...}}``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return {k: v for k, v in data.items() if not k.startswith("_")}


def paper_reference(dataset_name: Optional[str]) -> Optional[Tuple[str, dict]]:
    """``(key, entry)`` of the paper's results for a dataset name or key, matched on :func:`normalise_name`."""
    if not dataset_name:
        return None
    wanted = normalise_name(dataset_name)
    return next(((key, entry) for key, entry in load_paper_results().items() if normalise_name(key) == wanted), None)
