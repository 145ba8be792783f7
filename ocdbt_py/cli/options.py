"""Arguments shared by subcommands, and their parsing: the one CLI grammar.

Every subcommand gets the common options by calling :func:`add_location` once per location
argument it takes (a database, a checkpoint, a manager root)::

    add_location(p)                                   # URL, must exist
    add_location(p, dest="dst", metavar="DST", must_exist=False)   # a second location

The first call adds, besides the positional argument:

* ``-S/--storage-option K=V`` (repeatable): fsspec storage options;
* ``--timeout SECONDS``: how long an object store may take to answer (connect/read timeouts
  and the wait for the first answer, :data:`DEFAULT_TIMEOUT` by default; ``0``: no limit);
* ``--json``: machine-readable output on stdout;
* ``--quiet``: no progress or notes on stderr (errors are still reported);
* ``--debug``: tracebacks and third-party log messages.

The application (:mod:`ocdbt_py.cli.app`) checks every location declared with
``must_exist=True`` before the command runs, so a missing path gives one message and exit
status 1 whatever the command (:func:`ocdbt_py.cli.locate.check_locations`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any

from ocdbt_py.bridges.namemap import load_name_map
from ocdbt_py.cli.errors import UsageError
from ocdbt_py.timeutil import to_nanoseconds
from ocdbt_py.units import parse_size

__all__ = [
    "DEFAULT_TIMEOUT",
    "LOCATIONS",
    "add_common",
    "add_location",
    "add_version",
    "add_json",
    "add_quiet",
    "add_progress",
    "storage_options",
    "parse_version",
    "parse_storage_option",
    "parse_timeout",
    "is_remote",
    "name_map_arg",
]

#: Seconds an object store may take to answer an interactive command (``--timeout``).
DEFAULT_TIMEOUT = 10.0

#: Name of the parser default holding ``[(dest, must_exist, file_ok), ...]`` of a command's locations.
LOCATIONS = "_locations"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


def _has_option(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions


def add_common(parser: argparse.ArgumentParser) -> None:
    """``--debug`` (tracebacks on errors); also accepted before the subcommand."""
    if _has_option(parser, "--debug"):
        return
    parser.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS,
        help="show tracebacks and third-party log messages on errors",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    """``--json``: machine-readable output (added once; calling it again is harmless)."""
    if not _has_option(parser, "--json"):
        parser.add_argument("--json", action="store_true", help="print JSON on stdout instead of text")


def add_quiet(parser: argparse.ArgumentParser) -> None:
    """``-q/--quiet``: no progress lines or notes on stderr (added once)."""
    if not _has_option(parser, "--quiet"):
        parser.add_argument("-q", "--quiet", action="store_true",
                            help="no progress or notes on stderr (errors are still reported)")


def add_location(
    parser: argparse.ArgumentParser,
    *,
    dest: str = "url",
    metavar: str = "URL",
    help: str | None = None,
    must_exist: bool = True,
    optional: bool = False,
    file_ok: bool = False,
) -> None:
    """A positional location argument, plus (once per parser) ``-S``, ``--timeout``,
    ``--json``, ``--quiet`` and ``--debug``.

    ``must_exist``: the application reports a missing location before the command runs
    (use ``False`` for an output location or one that ``--create`` may make).  ``optional``:
    the argument may be left out (``nargs="?"``, default ``None``).  ``file_ok``: the location
    may be a single file (``import``'s SRC); otherwise a plain file there is "not a database or
    checkpoint".
    """
    text = help or ("a local path or any fsspec URL (s3://, gs://, az://, ...): a database, "
                    "an Orbax checkpoint item, step or manager root")
    if optional:
        parser.add_argument(dest, metavar=metavar, nargs="?", default=None, help=text)
    else:
        parser.add_argument(dest, metavar=metavar, help=text)
    locations = list(parser.get_default(LOCATIONS) or [])
    locations.append((dest, must_exist, file_ok))
    parser.set_defaults(**{LOCATIONS: locations})
    if not _has_option(parser, "--storage-option"):
        parser.add_argument(
            "-S", "--storage-option", metavar="K=V", action="append", default=[],
            type=parse_storage_option, dest="storage_option",
            help="fsspec storage option (repeatable); V is parsed as JSON when it can be "
            "(true, 3, null, \"s\"), else taken as a string",
        )
        parser.add_argument(
            "--timeout", metavar="SECONDS", type=parse_timeout, default=DEFAULT_TIMEOUT,
            help=f"give up when an object store does not answer within SECONDS (default {DEFAULT_TIMEOUT:g}; "
            "0: wait as long as the storage library does); local paths ignore it",
        )
    add_json(parser)
    add_quiet(parser)
    add_common(parser)


def add_version(parser: argparse._ActionsContainer, help: str | None = None) -> None:
    """``--version V``: a generation number or an ISO-8601 time (latest commit at or before it)."""
    parser.add_argument(
        "--version", metavar="V", type=parse_version, default=None,
        help=help or "read generation V (an integer) or the latest commit at or before the "
        "ISO-8601 time V (e.g. 2024-05-01T12:00:00Z); default: the latest",
    )


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress`` (default: a progress line when stderr is a terminal;
    added once)."""
    if _has_option(parser, "--progress"):
        return
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress line on stderr (default: when stderr is a terminal and not --quiet)",
    )


def parse_storage_option(text: str) -> tuple[str, Any]:
    """``"k=v"`` -> ``("k", v)`` with ``v`` decoded as JSON when possible."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. -S anon=true), got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def size_arg(text: str) -> int:
    """An argparse type for byte counts (``4096``, ``64MiB``, ``5GB``; see :func:`ocdbt_py.units.parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_timeout(text: str) -> float:
    """``--timeout``: seconds, a number >= 0."""
    try:
        t = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds (e.g. --timeout 30), got {text!r}") from None
    if not t >= 0 or t == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0 (e.g. --timeout 30), got {text!r}")
    return t


def is_remote(url: str) -> bool:
    """Whether ``url`` names an object store or another remote filesystem (not a local path)."""
    return bool(_URL.match(url)) and not url.startswith("file://") or "::" in url


def _timeout_options(url: str, timeout: float) -> dict[str, Any]:
    """Connect/read timeouts and a small retry budget for the backends that take them."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if not timeout:
        return {}
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": timeout, "read_timeout": timeout,
                                  "retries": {"max_attempts": 2}}}
    if scheme in ("az", "abfs", "abfss"):
        seconds = max(1, math.ceil(timeout))  # adlfs takes whole seconds
        return {"connection_timeout": seconds, "read_timeout": seconds}
    return {}


def storage_options(args: argparse.Namespace, url: str | None = None) -> dict[str, Any] | None:
    """The ``--storage-option`` values as a dict (``None`` when there are none and ``url`` is
    local), with the ``--timeout`` defaults for ``url`` (default ``args.url``) underneath."""
    pairs = getattr(args, "storage_option", None) or []
    opts = dict(pairs)
    loc = url if url is not None else getattr(args, "url", None)
    if isinstance(loc, str) and is_remote(loc):
        timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
        for k, v in _timeout_options(loc, timeout).items():
            if k not in opts:
                opts[k] = v
            elif isinstance(v, dict) and isinstance(opts[k], dict):
                opts[k] = {**v, **opts[k]}
    return opts or None


def parse_version(text: str) -> int | str:
    """An ``int`` generation (>= 1) or a validated ISO-8601 time string."""
    t = text.strip()
    if t.isdigit():
        g = int(t)
        if g < 1:
            raise argparse.ArgumentTypeError("generations start at 1")
        return g

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
