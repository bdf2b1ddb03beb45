"""merge's refusal: MergeError, and how a refused value is shown in its one line.

Holds no checks of its own (vetting, planning and the copy raise it) and must not read a database.
"""
from ...errors import StragglerError


class MergeError(StragglerError):
    """An input or the output was refused; nothing was written."""


def show(value, limit=60):
    """A value for a one-line message: repr (escapes newlines and control characters), shortened."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
