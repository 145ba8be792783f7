"""``ocdbt versions``: every committed generation."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.locate import open_database
from ocdbt_py.cli.options import add_json, add_location
from ocdbt_py.cli.output import human_bytes, print_json, print_table, ref_json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``versions`` subcommand."""
    p = subparsers.add_parser(
        "versions",
        help="list the committed generations",
        description="List every generation still reachable from the manifest, oldest first, "
        "with its commit time and statistics. Any of them can be read with --version.",
    )
    add_location(p)
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the generations."""

    db = open_database(args)
    versions = db.versions()
    if args.json:
        print_json([
            {
                "generation": v.generation,
                "commit_time": v.commit_time_iso,
                "commit_time_ns": v.commit_time_ns,
                "num_keys": v.num_keys,
                "num_tree_bytes": v.num_tree_bytes,
                "num_indirect_value_bytes": v.num_indirect_value_bytes,
                "root_height": v.root_height,
                "root": ref_json(v.root),
            }
            for v in versions
        ])
        return 0
    print_table(
        ("GENERATION", "COMMIT TIME (UTC)", "KEYS", "TREE BYTES", "VALUE BYTES", "HEIGHT"),
        (
            (str(v.generation), v.commit_time_iso, str(v.num_keys), human_bytes(v.num_tree_bytes),
             human_bytes(v.num_indirect_value_bytes), str(v.root_height))
            for v in versions
        ),
        (True, False, True, True, True, True),
    )
    return 0
