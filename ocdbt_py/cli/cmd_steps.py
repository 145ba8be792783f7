"""``ocdbt steps``: the committed steps of a CheckpointManager root."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from ocdbt_py.cli.options import add_json, add_location


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``steps`` subcommand."""
    p = subparsers.add_parser(
        "steps",
        help="list the steps of a checkpoint manager root",
        description="List the committed steps of an Orbax or ocdbt-py CheckpointManager root, "
        "oldest first, with commit time, items and metrics. Unfinished saves are not listed.",
    )
    add_location(p)
    p.add_argument("--prefix", default=None, help="step name prefix (step_prefix); default: plain integers")
    p.add_argument("--width", type=int, default=None, metavar="N",
                   help="zero-padded step width (step_format_fixed_length)")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the steps."""
    from ocdbt_py.checkpoint.layout import list_items
    from ocdbt_py.checkpoint.manager.naming import StepNameFormat
    from ocdbt_py.checkpoint.manager.steps import scan
    from ocdbt_py.cli.errors import value_errors_as_usage
    from ocdbt_py.cli.locate import normalize_url
    from ocdbt_py.cli.options import storage_options
    from ocdbt_py.cli.output import print_json, print_table
    from ocdbt_py.errors import NotFoundError
    from ocdbt_py.kvstore import open_kvstore
    from ocdbt_py.kvstore.prefixed import PrefixStore

    with value_errors_as_usage():
        fmt = StepNameFormat(args.prefix, args.width)
    kv = open_kvstore(normalize_url(args.url), storage_options(args), read_only=True)
    names, infos = scan(kv, fmt)
    if not names and not kv.list_dir("")[0]:
        raise NotFoundError(f"{args.url} does not exist or is empty (no checkpoint steps there)")
    rows: list[dict[str, Any]] = []
    for step, name in names.items():
        info = infos[step]
        when = datetime.datetime.fromtimestamp(info.time, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        items = sorted(list_items(PrefixStore(kv, name)))
        rows.append({"step": step, "name": name, "commit_time": when, "items": items,
                     "metrics": dict(info.metrics) if info.metrics is not None else None})
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ("STEP", "NAME", "COMMIT TIME (UTC)", "ITEMS", "METRICS"),
        ((str(r["step"]), r["name"], r["commit_time"], ",".join(r["items"]),
          "" if r["metrics"] is None else ", ".join(f"{k}={v}" for k, v in r["metrics"].items()))
         for r in rows),
        (True, False, False, False, False),
    )
    return 0
