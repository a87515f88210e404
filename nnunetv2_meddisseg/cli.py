"""The error convention of every ``nnUNetv2_meddisseg_*`` command.

A user mistake (a file, folder or option) ends the command with one line on stderr, ``<prog>: error: <message>``,
and exit code 2, as argparse does; a bug keeps its traceback. PyTorch's "No CUDA runtime is found" warning (a CUDA
toolkit without a GPU, once e.g. NNCF imports ``torch.utils.cpp_extension``) is filtered out: the commands run on
the CPU there, and it would precede the error line.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Callable, Optional, Sequence, Tuple, Type

from nnunetv2_meddisseg.errors import UserError

__all__ = ["EXIT_USER_ERROR", "print_error", "run_command", "quiet_cuda_home_warning", "DefaultsHelpFormatter",
           "add_device_argument", "resolve_device", "DEVICE_DEFAULT_TEXT", "STATES_DEFAULT", "plain_text"]

EXIT_USER_ERROR = 2


def print_error(prog: str, error: BaseException | str) -> None:
    """Print ``prog: error: <message>`` to stderr as exactly one line (whitespace collapsed)."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)


class _NoCudaHomeWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_home_warning() -> None:
    """Filter PyTorch's "No CUDA runtime is found" warning out of its logger (once, without importing torch)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaHomeWarning) for f in logger.filters):
        logger.addFilter(_NoCudaHomeWarning())


def run_command(prog: str, command: Callable[[Optional[Sequence[str]]], Optional[int]],
                argv: Optional[Sequence[str]] = None,
                user_errors: Tuple[Type[BaseException], ...] = (UserError, FileNotFoundError)) -> int:
    """Run ``command(argv)``; return its exit code (0 for None), or ``EXIT_USER_ERROR`` after printing a
    ``user_errors`` exception as one line. Console entry points ``sys.exit`` this value."""
    quiet_cuda_home_warning()
    try:
        code = command(argv)
    except user_errors as e:
        print_error(prog, e)
        return EXIT_USER_ERROR
    return 0 if code is None else int(code)


#: a help text that already states its default: "(default: X)", "(default X)", "(...; default: X)"
STATES_DEFAULT = re.compile(r"(\(|; )default[: ]")

#: the one device rule of every command that runs a network
DEVICE_DEFAULT_TEXT = "cuda if available, else cpu"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to each option's help that does not state it; flags read ``(default: off)``.
    Options with a default of None must say in their help what None means."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or action.default is None or STATES_DEFAULT.search(text)):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            value = "off"  # the flag is not given
        elif isinstance(action.default, (list, tuple)):
            value = " ".join(map(str, action.default))
        else:
            value = "%(default)s"
        return f"{text} (default: {value})".strip()


def add_device_argument(parser: argparse.ArgumentParser, choices: Sequence[str] = ("cpu", "cuda"),
                        what: str = "device to run on") -> None:
    """``--device`` with the commands' common default (None, resolved by :func:`resolve_device`)."""
    parser.add_argument("--device", default=None, choices=tuple(choices),
                        help=f"{what} (default: {DEVICE_DEFAULT_TEXT})")


def resolve_device(device: Optional[str]) -> str:
    """``device``, or for None: ``cuda`` if torch sees a CUDA device, else ``cpu``."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def plain_text(text: str) -> str:
    """``text`` (a docstring paragraph) without reStructuredText's double backticks, for ``-h``."""
    return text.replace("``", "")
