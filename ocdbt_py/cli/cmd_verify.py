"""``ocdbt verify``: check every node of every version (see :mod:`ocdbt_py.maintenance.verify`)."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.locate import open_database, open_kvstore_checked
from ocdbt_py.cli.options import add_json, add_location, add_progress, add_version
from ocdbt_py.cli.output import human_bytes, out, print_json
from ocdbt_py.cli.progress import Progress, progress_enabled


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``verify`` subcommand."""
    p = subparsers.add_parser(
        "verify",
        help="check the integrity of a database (exit status 1 if damaged)",
        description="Walk every node of every version: check checksums, node structure, key "
        "order across nodes, the statistics stored in parents, and that every referenced byte "
        "range exists in its data file. Exit status 0 when clean, 1 with a report of the "
        "problems found.",
    )
    add_location(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--latest", action="store_true", help="check only the latest version")
    add_version(g, help="check only version V (a generation number or an ISO-8601 time)")
    p.add_argument("--max-problems", type=int, default=20, metavar="N",
                   help="stop after N problems (default 20)")
    p.add_argument("--data", action="store_true",
                   help="also decode every chunk of every Zarr array (checkpoint parameters) in the "
                   "latest (or selected) version and report the chunks that fail")
    add_json(p)
    add_progress(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Verify and report."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.maintenance.verify import VerifyReport, verify

    if args.max_problems < 1:
        raise UsageError("--max-problems must be at least 1")
    with Progress("verifying", enabled=progress_enabled(args)) as bar:
        def progress(r: VerifyReport) -> None:
            if r.data is not None:  # the --data pass
                d = r.data
                bar.update(d.chunks, d.chunks_expected,
                           f"{d.chunks}/{d.chunks_expected} chunks decoded, {human_bytes(d.chunk_bytes)}")
                return
            bar.update(r.versions, r.versions_expected,
                       f"{r.versions}/{r.versions_expected} versions, {r.nodes} nodes, "
                       f"{human_bytes(r.bytes_checked)}")

        if args.version is not None:
            target: object = open_database(args)
            report = verify(target, all_versions=False, progress=progress,  # type: ignore[arg-type]
                            max_problems=args.max_problems, data=args.data)
        else:
            kv = open_kvstore_checked(args)
            report = verify(kv, all_versions=not args.latest, progress=progress,
                            max_problems=args.max_problems, data=args.data)
    if args.json:
        print_json(report.to_json())
    else:
        out().write(report.format() + "\n")
    return 0 if report.ok else 1
