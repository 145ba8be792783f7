"""``ocdbt report``: a self-contained HTML page about a checkpoint (tree, sizes, histograms,
NaN/Inf table, sortable statistics; metrics across steps for a manager root)."""

from __future__ import annotations

import argparse
import os
import sys

from ocdbt_py.cli.errors import UsageError, value_errors_as_usage
from ocdbt_py.cli.inspect_args import add_inspect_common, check_workers, progress_callback
from ocdbt_py.cli.options import add_location, storage_options
from ocdbt_py.cli.output import check_overwrite, human_bytes, print_json

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a checkpoint",
        description="Read every chunk of a checkpoint once and write one HTML file (no network needed "
        "to view it): the tree of tensors (collapsible), where the bytes are, the NaN/Inf table, a "
        "sortable statistics table with a histogram per tensor and, for a CheckpointManager root, the "
        "saved metrics across steps.",
    )
    add_location(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="HTML file to write")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    add_inspect_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the report."""

    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.inspect.report import report

    check_workers(args)
    parent = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(parent):
        raise UsageError(f"cannot write {args.output}: directory {parent} does not exist")
    check_overwrite(args.output, args.force)
    with value_errors_as_usage(), progress_callback(args, "report") as progress:
        data = report(args.url, args.output, step=args.step, storage_options=storage_options(args),
                      include=args.include or None, workers=args.workers, progress=progress)
    nbad = sum(1 for s in data.stats.values() if s.nonfinite)
    if args.json:
        print_json({"output": args.output, "tensors": len(data.stats), "nonfinite_tensors": nbad,
                    "step": data.step})
    else:  # the result, on stdout like every command's
        size = human_bytes(os.path.getsize(args.output))
        sys.stdout.write(f"wrote {args.output} ({size}): {len(data.stats)} tensors, {nbad} with NaN or Inf\n")
    return 0
