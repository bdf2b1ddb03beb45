"""Errors a user can act on: one line, what failed and what to do. The CLI prints them
without a traceback and exits with `exit_code`."""


class StragglerError(Exception):
    """An expected failure with a one-line, actionable message."""
    exit_code = 2


class UsageError(StragglerError):
    exit_code = 2
