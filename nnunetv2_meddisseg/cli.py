"""The error convention of every ``nnUNetv2_meddisseg_*`` command.

A user mistake (a file, folder or option) ends the command with exactly one line on stderr,
``nnUNetv2_meddisseg_<verb>: error: <message>``, and exit code :data:`EXIT_USER_ERROR` (2, the code
argparse uses for a bad command line, so both kinds of mistake look alike). Anything else is a bug
and keeps its traceback.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence, Tuple, Type

__all__ = ["EXIT_USER_ERROR", "UserError", "print_error", "run_command"]

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake in the user's input (a file, folder or option), reported without a traceback."""


def print_error(prog: str, error: BaseException | str) -> None:
    """Print ``prog: error: <message>`` to stderr as exactly one line (whitespace collapsed)."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)


def run_command(prog: str, command: Callable[[Optional[Sequence[str]]], Optional[int]],
                argv: Optional[Sequence[str]] = None,
                user_errors: Tuple[Type[BaseException], ...] = (UserError, FileNotFoundError)) -> int:
    """Run ``command(argv)`` and return its exit code (0 where it returns None).

    An exception of a ``user_errors`` type is printed as ``prog: error: ...`` (one line) and gives
    :data:`EXIT_USER_ERROR`. Console entry points return this value (``sys.exit(main())``)."""
    try:
        code = command(argv)
    except user_errors as e:
        print_error(prog, e)
        return EXIT_USER_ERROR
    return 0 if code is None else int(code)
