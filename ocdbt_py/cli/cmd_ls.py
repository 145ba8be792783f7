"""``ocdbt ls``: list keys, optionally with size and location."""

from __future__ import annotations

import argparse
import json
from typing import IO

from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.locate import open_database
from ocdbt_py.cli.options import add_json, add_location, add_progress, add_version
from ocdbt_py.cli.output import out, ref_text
from ocdbt_py.cli.progress import Progress, progress_enabled
from ocdbt_py.keys import escape_key, parse_hex_key, unescape_key

_BATCH = 1000
_MAX_KEY_PAD = 60


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``ls`` subcommand."""
    p = subparsers.add_parser(
        "ls",
        help="list keys (with size and location: -l)",
        description="List the keys of a database in byte order. Keys that are not printable "
        "UTF-8 are shown with \\xNN escapes (a backslash as \\\\); --json adds key_hex.",
    )
    add_location(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prefix", metavar="P", default=None,
                   help="only keys starting with P (text; \\xNN escapes as ls prints them)")
    g.add_argument("--prefix-hex", metavar="H", default=None, help="only keys starting with hex bytes H")
    add_version(p)
    p.add_argument("-l", "--long", action="store_true",
                   help="show each key's size in bytes and where its value is: inline or FILE:OFFSET")
    p.add_argument("-n", "--limit", type=int, default=None, metavar="N", help="stop after N keys")
    add_json(p)
    add_progress(p)
    p.set_defaults(func=run)


def _prefix(args: argparse.Namespace) -> bytes:
    try:
        if args.prefix_hex is not None:
            return parse_hex_key(args.prefix_hex)
        if args.prefix is not None:
            return unescape_key(args.prefix)
    except ValueError as e:
        raise UsageError(f"bad prefix: {e}") from None
    return b""


def run(args: argparse.Namespace) -> int:
    """List the keys."""


    prefix = _prefix(args)
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    db = open_database(args)
    stream = out()
    # A progress line only when the listing goes elsewhere (a file or a pipe).
    try:
        to_tty = stream.isatty()
    except (AttributeError, ValueError):
        to_tty = False
    show = progress_enabled(args) and (args.progress or not to_tty)
    total = len(db) if not prefix else None
    n = 0
    with Progress("listing", enabled=show) as bar:
        entries = db.entries(prefix)
        if args.json:
            stream.write("[")
            for e in entries:
                if args.limit is not None and n >= args.limit:
                    break
                item = {
                    "key": escape_key(e.key, ascii_only=False),  # JSON escapes the rest
                    "key_hex": e.key.hex(),
                    "size": e.size,
                    "inline": e.location is None,
                    "file": None if e.location is None else escape_key(e.location.file.path, ascii_only=False),
                    "offset": None if e.location is None else e.location.offset,
                }
                stream.write(("\n  " if n == 0 else ",\n  ") + json.dumps(item, ensure_ascii=True))
                n += 1
                bar.update(n, total, f"{n} keys")
            stream.write("\n]\n" if n else "]\n")
            return 0
        rows: list[tuple[str, str, str]] = []
        for e in entries:
            if args.limit is not None and n >= args.limit:
                break
            n += 1
            if not args.long:
                stream.write(escape_key(e.key) + "\n")
            else:
                loc = "inline" if e.location is None else ref_text(e.location)
                rows.append((escape_key(e.key), str(e.size), loc))
                if len(rows) >= _BATCH:
                    _flush(stream, rows)
                    rows = []
            bar.update(n, total, f"{n} keys")
        if rows:
            _flush(stream, rows)
    return 0


def _flush(stream: IO[str], rows: list[tuple[str, str, str]]) -> None:
    kw = min(max(len(r[0]) for r in rows), _MAX_KEY_PAD)
    sw = max(len(r[1]) for r in rows)
    for key, size, loc in rows:
        stream.write(f"{key.ljust(kw)}  {size.rjust(sw)}  {loc}\n")
