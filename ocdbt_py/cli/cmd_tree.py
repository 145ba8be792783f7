"""``ocdbt tree``: placeholder until the checkpoint reader provides the real command.

The checkpoint reader replaces this module with one that shows an Orbax checkpoint's tree of
arrays (names, shapes, dtypes).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``tree`` subcommand (a placeholder)."""
    p = subparsers.add_parser(
        "tree",
        help="show a checkpoint's tree of arrays (comes with the checkpoint reader)",
        description="Not available yet: the tree view of an Orbax checkpoint comes with the "
        "checkpoint reader. Use 'ocdbt ls URL' to list the keys meanwhile.",
    )
    p.add_argument("url", metavar="URL", nargs="?", help="checkpoint location")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Say that the command is not available yet."""
    from ocdbt_py.cli.errors import CliError

    where = args.url or "URL"
    raise CliError(
        "tree: not available yet; the checkpoint tree view comes with the checkpoint reader. "
        f"Meanwhile 'ocdbt ls {where}' lists the keys."
    )
