"""``ocdbt rm``: delete keys, a prefix or a key range in one commit."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.cmd_put import add_key, add_writer_options, open_writable, parse_keys
from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.options import add_json, add_location
from ocdbt_py.cli.output import key_json, print_json
from ocdbt_py.keys import escape_key


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``rm`` subcommand."""
    p = subparsers.add_parser(
        "rm",
        help="delete keys (one commit)",
        description="Delete the given KEYs, and/or every key starting with --prefix, and/or "
        "every key in [--start, --stop), all in one new generation. Deleting an absent key "
        "is not an error (it still makes a generation, as in TensorStore). Prints what was "
        "deleted and the new generation.",
    )
    add_location(p)
    add_key(p, nargs="*")
    p.add_argument("--prefix", metavar="P", default=None, help="delete every key starting with P")
    p.add_argument("--start", metavar="K", default=None, help="delete keys >= K (with --stop)")
    p.add_argument("--stop", metavar="K", default=None, help="delete keys < K (default: no bound)")
    add_writer_options(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Delete."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.read.snapshot import prefix_end

    if not args.key and args.prefix is None and args.start is None:
        raise UsageError("nothing to delete: give KEYs, --prefix or --start")
    if args.stop is not None and args.start is None:
        raise UsageError("--stop needs --start")
    args.create = False
    keys = parse_keys(args, list(args.key))
    prefix = None if args.prefix is None else parse_keys(args, [args.prefix])[0]
    start = None if args.start is None else parse_keys(args, [args.start])[0]
    stop = None if args.stop is None else parse_keys(args, [args.stop])[0]
    db = open_writable(args)
    before = db.generation
    with db.transaction() as t:
        for k in keys:
            t.delete(k)
        if prefix is not None:
            t.delete_range(prefix, prefix_end(prefix))
        if start is not None:
            t.delete_range(start, stop)
    gen = t.generation
    if args.json:
        print_json({"generation": gen, "url": args.url, "keys": [key_json(k) for k in keys],
                    "prefix": None if prefix is None else escape_key(prefix, ascii_only=False),
                    "start": None if start is None else escape_key(start, ascii_only=False),
                    "stop": None if stop is None else escape_key(stop, ascii_only=False)})
    elif gen == before:
        print(f"nothing to delete ({_what(keys, prefix, start, stop)}) in {args.url}: no new generation, the "
              f"latest is still {gen}")
    else:
        print(f"deleted {_what(keys, prefix, start, stop)} in {args.url}: generation {gen}")
    return 0


def _what(keys: list[bytes], prefix: bytes | None, start: bytes | None, stop: bytes | None) -> str:
    """``2 keys, every key under 'p/' and keys from 'a' to 'b'`` (what was asked to go)."""
    parts = []
    if keys:
        parts.append(f"'{escape_key(keys[0])}'" if len(keys) == 1 else f"{len(keys)} keys")
    if prefix is not None:
        parts.append(f"every key under '{escape_key(prefix)}'")
    if start is not None:
        parts.append(f"keys from '{escape_key(start)}'" + ("" if stop is None else f" up to '{escape_key(stop)}'"))
    return ", ".join(parts)
