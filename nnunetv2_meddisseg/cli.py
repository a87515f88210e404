"""The error convention of every ``nnUNetv2_meddisseg_*`` command.

Every command's ``-h`` shows each option's default (:class:`DefaultsHelpFormatter`) and every
command that runs a network takes ``--device`` with one default: cuda if available, else cpu.

A user mistake (a file, folder or option) ends the command with exactly one line on stderr,
``nnUNetv2_meddisseg_<verb>: error: <message>``, and exit code :data:`EXIT_USER_ERROR` (2, the code
argparse uses for a bad command line, so both kinds of mistake look alike). Anything else is a bug
and keeps its traceback. PyTorch's "No CUDA runtime is found" warning, logged where a CUDA toolkit is installed
without a GPU when a library imports ``torch.utils.cpp_extension`` (NNCF's quantization does), is filtered out
(:func:`quiet_cuda_home_warning`): the commands run on the CPU there, and the line would precede the error line.
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
    """Filter PyTorch's "No CUDA runtime is found, using CUDA_HOME=..." warning out of its logger (without importing
    torch; once per process)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaHomeWarning) for f in logger.filters):
        logger.addFilter(_NoCudaHomeWarning())


def run_command(prog: str, command: Callable[[Optional[Sequence[str]]], Optional[int]],
                argv: Optional[Sequence[str]] = None,
                user_errors: Tuple[Type[BaseException], ...] = (UserError, FileNotFoundError)) -> int:
    """Run ``command(argv)`` and return its exit code (0 where it returns None).

    An exception of a ``user_errors`` type is printed as ``prog: error: ...`` (one line) and gives
    :data:`EXIT_USER_ERROR`. Console entry points return this value (``sys.exit(main())``)."""
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
    """Appends ``(default: X)`` to the help of every option whose help does not state its default already;
    flags (store_true and store_false alike) read ``(default: off)``: not given. Options with a default
    of None must say in their help what None means."""

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
