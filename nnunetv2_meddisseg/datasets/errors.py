"""The converters' errors: every user mistake is a ``ConversionError``."""
from nnunetv2_meddisseg.errors import UserError

__all__ = ["ConversionError", "OptionError", "MissingSourceError"]


class ConversionError(UserError, ValueError):
    """A bad option or source file; ``str(err)`` is one line naming it and what was expected."""


class OptionError(ConversionError):
    """A bad command-line option (``--resize 0``, a bad ``-d``, a bad ``--split_file``)."""


class MissingSourceError(ConversionError, FileNotFoundError):
    """A source folder or file that the publisher's layout requires is missing."""
