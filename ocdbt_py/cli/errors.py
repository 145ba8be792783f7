"""Exceptions a subcommand raises to end with a one-line message and an exit status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ocdbt_py.errors import OcdbtError

__all__ = ["CliError", "UsageError", "value_errors_as_usage"]


class CliError(Exception):
    """A user-facing failure: the message (possibly several lines) goes to stderr.

    ``status`` is the exit status (1 by default).
    """

    status = 1

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class UsageError(CliError):
    """The arguments do not make sense (exit status 2, like argparse's own errors)."""

    status = 2


@contextlib.contextmanager
def value_errors_as_usage() -> Iterator[None]:
    """Turn a plain ``ValueError`` (a bad option combination, e.g. ``--step`` on an item
    directory) into a :class:`UsageError`; our own errors pass through unchanged."""

    try:
        yield
    except ValueError as e:
        if isinstance(e, OcdbtError):
            raise
        raise UsageError(str(e)) from e
