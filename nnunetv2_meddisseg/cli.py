"""What every ``nnUNetv2_meddisseg_*`` command shares: user errors become one line on stderr."""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

__all__ = ["UserError", "print_error", "run_command"]


class UserError(Exception):
    """A mistake in the user's input (a file, folder or option), reported without a traceback."""


def print_error(prog: str, error: BaseException | str) -> None:
    """Print ``prog: error: <message>`` to stderr as exactly one line (whitespace collapsed)."""
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)


def run_command(prog: str, command: Callable[[Optional[Sequence[str]]], None],
                argv: Optional[Sequence[str]] = None) -> None:
    """Run ``command(argv)``; a :class:`UserError` (or a missing file) ends the process with exit code 2
    and the message ``prog: error: ...`` on one line."""
    try:
        command(argv)
    except (UserError, FileNotFoundError) as e:
        print_error(prog, e)
        sys.exit(2)
