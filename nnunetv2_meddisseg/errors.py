"""The error for a mistake in the user's input, printed as ``<prog>: error: <message>`` (``cli.run_command``)."""
from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A mistake in the user's input (a file, folder or option), reported without a traceback."""
