"""``ocdbt gc``: delete data files that no kept version references."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.locate import normalize_url, open_kvstore_checked
from ocdbt_py.cli.options import add_json, add_location, parse_version, storage_options
from ocdbt_py.cli.output import print_json
from ocdbt_py.kvstore import open_kvstore


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``gc`` subcommand."""
    p = subparsers.add_parser(
        "gc",
        help="delete data files no kept version references",
        description="Garbage-collect data files. With --keep-versions N or --keep-since TIME, "
        "first drop older versions from the history (the latest is always kept); then delete "
        "every data file that no remaining version references and that is older than the "
        "grace period (so commits in flight keep their files). Nested databases (such as "
        "Orbax's ocdbt.process_*) are never touched. TensorStore has no garbage collector; "
        "it reads the result normally.",
    )
    add_location(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--keep-versions", metavar="N", type=int, default=None,
                   help="keep only the newest N versions")
    g.add_argument("--keep-since", metavar="TIME", default=None,
                   help="keep the versions current at or after the ISO-8601 TIME")
    p.add_argument("--grace", metavar="SECONDS", type=float, default=None,
                   help="never delete files younger than this (default: 3600)")
    p.add_argument("--dry-run", "-n", action="store_true", help="only report what would be deleted")
    p.add_argument("--force", action="store_true",
                   help="collect even inside another database (whose files it may reference)")
    p.add_argument("-v", "--verbose", action="store_true", help="list the files")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Collect garbage and report."""
    from ocdbt_py.maintenance.gc import DEFAULT_GRACE_SECONDS, collect_garbage

    if args.keep_versions is not None and args.keep_versions < 1:
        raise UsageError("--keep-versions must be at least 1")
    if args.keep_since is not None:
        try:
            if isinstance(parse_version(args.keep_since), int):
                raise ValueError("not a time")
        except (ValueError, argparse.ArgumentTypeError):
            raise UsageError(f"--keep-since needs an ISO-8601 time, got {args.keep_since!r}") from None
    grace = DEFAULT_GRACE_SECONDS if args.grace is None else args.grace
    if grace < 0:
        raise UsageError("--grace must not be negative")
    open_kvstore_checked(args)  # helpful error when URL holds no database
    kv = open_kvstore(normalize_url(args.url), storage_options(args), read_only=args.dry_run)
    report = collect_garbage(kv, keep_versions=args.keep_versions, keep_since=args.keep_since,
                             grace_seconds=grace, dry_run=args.dry_run, force=args.force)
    if args.json:
        out = report.to_json()
        out["summary"] = report.summary()
        print_json(out)
    else:
        if args.verbose:
            for k in report.deleted:
                print(("would delete " if report.dry_run else "deleted ") + k)
            for k in report.kept_young:
                print("kept (younger than the grace period) " + k)
        if report.dropped_generations:
            gens = report.dropped_generations
            verb = "would drop" if report.dry_run else "dropped"
            print(f"{verb} generations {gens[0]}..{gens[-1]} ({len(gens)})")
        print(report.summary())
        for e in report.errors:
            print("error: " + e)
    return 1 if report.errors else 0
