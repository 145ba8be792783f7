"""Exceptions a subcommand raises to end with a one-line message and an exit status."""

from __future__ import annotations

__all__ = ["CliError", "UsageError"]


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
