"""The errors of the dataset converters: every user mistake is a :class:`ConversionError` whose message
is one line naming the file or option and what was expected."""
from nnunetv2_meddisseg.errors import UserError

__all__ = ["ConversionError", "OptionError", "MissingSourceError"]


class ConversionError(UserError, ValueError):
    """A problem with the user's options or source files; ``str(err)`` is one line naming the
    file or option and what was expected."""


class OptionError(ConversionError):
    """A bad command-line option (``--resize 0``, a bad ``-d``, a bad ``--split_file``)."""


class MissingSourceError(ConversionError, FileNotFoundError):
    """A source folder or file that the publisher's layout requires is missing."""
