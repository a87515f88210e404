"""The error every part of the package raises for a mistake in the user's input.

The commands print it as one line, ``<prog>: error: <message>``, without a traceback (``cli.run_command``).
"""
from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A mistake in the user's input (a file, folder or option), reported without a traceback."""
