"""``ocdbt put``: set one key in one commit."""

from __future__ import annotations

import argparse
import json
import os
import sys

from ocdbt_py.cli.cmd_get import parse_key
from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.locate import normalize_url, open_kvstore_checked, require_location
from ocdbt_py.cli.options import add_json, add_location, storage_options
from ocdbt_py.cli.output import human_bytes, key_json, print_json
from ocdbt_py.errors import NotFoundError, OcdbtError
from ocdbt_py.keys import escape_key


def add_key(p: argparse.ArgumentParser, nargs: str | None = None) -> None:
    """The KEY argument(s) and ``--hex`` / ``--escaped`` (as ``ocdbt get`` takes them)."""
    p.add_argument("key", metavar="KEY", nargs=nargs, help="the key (UTF-8 text unless --hex or --escaped)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hex", action="store_true", help="keys are hex digits (as key_hex in ls --json)")
    g.add_argument("--escaped", action="store_true", help="keys use the \\xNN and \\\\ escapes that ls prints")


def parse_keys(args: argparse.Namespace, texts: list[str]) -> list[bytes]:
    """Decode key arguments per ``--hex`` / ``--escaped``."""

    out = []
    for t in texts:
        ns = argparse.Namespace(key=t, hex=args.hex, escaped=args.escaped)
        out.append(parse_key(ns))
    return out


def add_writer_options(p: argparse.ArgumentParser) -> None:
    """``--create`` and ``--config``."""
    p.add_argument("--create", action="store_true",
                   help="create the database if there is none at URL")
    p.add_argument("--config", metavar="JSON", default=None,
                   help='database config as TensorStore spells it, e.g. \'{"manifest_kind": '
                   '"numbered", "max_inline_value_bytes": 64}\' (constraints on an existing '
                   "database, choices for a new one)")


def open_writable(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Open the database at ``args.url`` for writing (creating it only with ``--create``)."""

    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    import ocdbt_py
    from ocdbt_py.kvstore import open_kvstore

    config = None
    if args.config:
        try:
            config = json.loads(args.config)
        except ValueError as e:
            raise UsageError(f"--config is not valid JSON: {e}") from None
    if args.create:
        kv = open_kvstore(normalize_url(args.url), storage_options(args))
    else:
        require_location(args, fix="pass --create to create a database there")
        try:
            open_kvstore_checked(args)
        except NotFoundError as e:
            raise NotFoundError(f"{e}; pass --create to create one") from None
        kv = open_kvstore(normalize_url(args.url), storage_options(args))
    try:
        return ocdbt_py.open(kv, mode="a", config=config)
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config: {e}") from None


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``put`` subcommand."""
    p = subparsers.add_parser(
        "put",
        help="set one key (one commit)",
        description="Set KEY to VALUE (UTF-8 text), or to the bytes of FILE with -i ('-' reads "
        "stdin), as one new generation. Prints what was written and the new generation.",
    )
    add_location(p, must_exist=False)  # --create may make it
    add_key(p)
    p.add_argument("value", metavar="VALUE", nargs="?", default=None, help="the value as text")
    p.add_argument("-i", "--input", metavar="FILE", default=None,
                   help="read the value from FILE ('-' for stdin), streamed")
    add_writer_options(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the value."""


    if (args.value is None) == (args.input is None):
        raise UsageError("give exactly one of VALUE or -i FILE")
    (key,) = parse_keys(args, [args.key])
    db = open_writable(args)
    size: int | None = None  # unknown for stdin
    if args.input is None:
        value = str(args.value).encode("utf-8", "surrogateescape")
        size = len(value)
        gen = db.put(key, value)
    elif args.input == "-":
        gen = db.put(key, sys.stdin.buffer)
    else:
        try:
            with open(args.input, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                gen = db.put(key, f)
        except OSError as e:
            if isinstance(e, OcdbtError):
                raise
            raise UsageError(f"cannot read {args.input}: {e.strerror or e}") from None
    if args.json:
        print_json({"generation": gen, **key_json(key), "length": size, "url": args.url})
    else:
        length = "" if size is None else f" ({human_bytes(size)})"
        print(f"put '{escape_key(key)}'{length} into {args.url}: generation {gen}")
    return 0
