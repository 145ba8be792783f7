"""``ocdbt get``: write one value's raw bytes to stdout or a file."""

from __future__ import annotations

import argparse
import base64
import sys

from ocdbt_py.cli.errors import CliError, UsageError
from ocdbt_py.cli.locate import open_database
from ocdbt_py.cli.options import add_location, add_version
from ocdbt_py.cli.output import check_overwrite, key_json, print_json
from ocdbt_py.keys import escape_key, parse_hex_key, unescape_key


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``get`` subcommand."""
    p = subparsers.add_parser(
        "get",
        help="write a value's raw bytes to stdout or a file",
        description="Write the value of KEY, byte for byte, to stdout or to FILE. KEY is text "
        "(UTF-8) unless --hex or --escaped says otherwise. With --json, print one JSON object "
        'instead: {"key": escaped key, "key_hex": ..., "generation": N, "length": bytes, '
        '"value_base64": the value in base64}.',
    )
    add_location(p)
    p.add_argument("key", metavar="KEY", help="the key")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hex", action="store_true", help="KEY is hex digits (as key_hex in ls --json)")
    g.add_argument("--escaped", action="store_true",
                   help="KEY uses the \\xNN and \\\\ escapes that ls prints")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write to FILE instead of stdout ('-' for stdout)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    add_version(p)
    p.set_defaults(func=run)


def parse_key(args: argparse.Namespace) -> bytes:
    """The key argument as bytes, per ``--hex`` / ``--escaped``."""

    try:
        if args.hex:
            return parse_hex_key(args.key)
        if args.escaped:
            return unescape_key(args.key)
    except ValueError as e:
        raise UsageError(f"bad key: {e}") from None
    # surrogateescape gives back the exact bytes of a non-UTF-8 command-line argument
    return str(args.key).encode("utf-8", "surrogateescape")


def run(args: argparse.Namespace) -> int:
    """Fetch the value and write it."""


    key = parse_key(args)
    if args.json and args.output not in (None, "-"):
        raise UsageError("--json prints the value (base64) on stdout: drop -o FILE, or drop --json to write raw bytes")
    if args.output not in (None, "-"):
        check_overwrite(args.output, args.force)
    db = open_database(args)
    value = db.get(key)
    if value is None:
        raise CliError(f"key '{escape_key(key)}' not found in {args.url} (generation {db.generation})")
    if args.json:
        print_json({**key_json(key), "generation": db.generation, "length": len(value),
                    "value_base64": base64.b64encode(value).decode("ascii")})
        return 0
    if args.output in (None, "-"):
        stream = sys.stdout
        stream.flush()
        buf = getattr(stream, "buffer", None)
        if buf is None:  # a text-only stream: no way to write bytes faithfully
            raise CliError("stdout does not accept bytes; use -o FILE")
        buf.write(value)
        buf.flush()
    else:
        with open(args.output, "wb") as f:
            f.write(value)
    return 0
