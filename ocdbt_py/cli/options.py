"""Arguments shared by subcommands, and their parsing."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ocdbt_py.bridges.namemap import load_name_map
from ocdbt_py.cli.errors import UsageError

__all__ = [
    "add_common",
    "add_location",
    "add_version",
    "add_json",
    "add_progress",
    "storage_options",
    "parse_version",
    "parse_storage_option",
    "name_map_arg",
]


def add_common(parser: argparse.ArgumentParser) -> None:
    """``--debug`` (tracebacks on errors); also accepted before the subcommand."""
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS,
        help="show a traceback on errors",
    )


def add_location(parser: argparse.ArgumentParser) -> None:
    """The positional ``url`` and repeatable ``--storage-option k=v``, plus :func:`add_common`."""
    parser.add_argument(
        "url", metavar="URL",
        help="database location: a local path or any fsspec URL (an Orbax item directory works)",
    )
    parser.add_argument(
        "-S", "--storage-option", metavar="K=V", action="append", default=[],
        type=parse_storage_option, dest="storage_option",
        help="fsspec storage option (repeatable); V is parsed as JSON when it can be "
        "(true, 3, null, \"s\"), else taken as a string",
    )
    add_common(parser)


def add_version(parser: argparse._ActionsContainer, help: str | None = None) -> None:
    """``--version V``: a generation number or an ISO-8601 time (latest commit at or before it)."""
    parser.add_argument(
        "--version", metavar="V", type=parse_version, default=None,
        help=help or "read generation V (an integer) or the latest commit at or before the "
        "ISO-8601 time V (e.g. 2024-05-01T12:00:00Z); default: the latest",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json``: machine-readable output."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: a progress line when stderr is a terminal)."""
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress line on stderr (default: when stderr is a terminal)",
    )


def parse_storage_option(text: str) -> tuple[str, Any]:
    """``"k=v"`` -> ``("k", v)`` with ``v`` decoded as JSON when possible."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``--storage-option`` values as a dict (``None`` when there are none)."""
    pairs = getattr(args, "storage_option", None) or []
    return dict(pairs) if pairs else None


def parse_version(text: str) -> int | str:
    """An ``int`` generation (>= 1) or a validated ISO-8601 time string."""
    t = text.strip()
    if t.isdigit():
        g = int(t)
        if g < 1:
            raise argparse.ArgumentTypeError("generations start at 1")
        return g
    from ocdbt_py.timeutil import to_nanoseconds

    try:
        to_nanoseconds(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a generation number nor an ISO-8601 time "
            "(like 2024-05-01T12:00:00Z)"
        ) from None
    return t


def name_map_arg(path: str | None) -> Any:
    """The :class:`~ocdbt_py.bridges.namemap.NameMap` of a ``--map FILE`` (``None`` without one);
    an unreadable or malformed file is a usage error."""
    if path is None:
        return None
    try:
        return load_name_map(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--map {path}: {e}") from e
