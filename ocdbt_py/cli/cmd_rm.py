"""``ocdbt rm``: delete keys, a prefix or a key range in one commit."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.cmd_put import add_key, add_writer_options, open_writable, parse_keys
from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.options import add_json, add_location
from ocdbt_py.cli.output import print_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``rm`` subcommand."""
    p = subparsers.add_parser(
        "rm",
        help="delete keys (one commit)",
        description="Delete the given KEYs, and/or every key starting with --prefix, and/or "
        "every key in [--start, --stop), all in one new generation. Deleting an absent key "
        "is not an error (it still makes a generation, as in TensorStore). Prints the "
        "generation.",
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
    with db.transaction() as t:
        for k in keys:
            t.delete(k)
        if prefix is not None:
            t.delete_range(prefix, prefix_end(prefix))
        if start is not None:
            t.delete_range(start, stop)
    gen = t.generation
    if args.json:
        print_json({"generation": gen})
    else:
        print(gen)
    return 0
