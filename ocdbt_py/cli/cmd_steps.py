"""``ocdbt steps``: the committed steps of a CheckpointManager root."""

from __future__ import annotations

import argparse
import datetime
import posixpath
import re
import sys
import warnings
from typing import Any

from ocdbt_py.cli.errors import CliError, UsageError, value_errors_as_usage
from ocdbt_py.cli.locate import normalize_url
from ocdbt_py.cli.options import add_json, add_location, storage_options
from ocdbt_py.cli.output import print_json, print_table
from ocdbt_py.errors import NotFoundError


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


def _naming_hint(kv: Any) -> str:
    """How to name the step directories of a root whose names have a prefix or fixed width."""

    for d in sorted(kv.list_dir("")[0]):
        m = re.fullmatch(r"(?:(.+?)_)?([0-9]+)", d)
        if m and (m.group(1) or (len(m.group(2)) > 1 and m.group(2).startswith("0"))):
            opts = (f"--prefix {m.group(1)} " if m.group(1) else "") + (
                f"--width {len(m.group(2))}" if m.group(2).startswith("0") and len(m.group(2)) > 1 else "")
            return f"directories like {d} are: pass {opts.strip()}"
    return ""


def _not_a_root(url: str, kv: Any) -> None:
    """Say what ``url`` is when it has no steps: an item or a step directory is a usage error
    (exit 2) naming the command to use; an empty directory or anything else, exit 1."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint.layout import Kind, classify, list_items

    try:
        kind = classify(kv)
    except NotFoundError:
        kind = None
    parent = posixpath.dirname(url.rstrip("/")) or "."
    if kind in (Kind.PYTREE, Kind.JSON):
        # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
        from ocdbt_py.checkpoint.layout import parse_step_name

        hint = ""
        if parse_step_name(posixpath.basename(parent)) is not None:  # an item of a manager's step
            hint = f", or list the steps of its manager root with `ocdbt steps {posixpath.dirname(parent) or '.'}`"
        raise UsageError(f"{url} is a checkpoint item, not a CheckpointManager root (which holds step "
                         f"directories): see its tree with `ocdbt tree {url}`{hint}")
    if kind is Kind.STEP:
        items = ", ".join(sorted(list_items(kv))) or "none"
        raise UsageError(f"{url} is a checkpoint step directory (items: {items}), not a CheckpointManager "
                         f"root: see its tree with `ocdbt tree {url}`, or list the steps of its root "
                         f"with `ocdbt steps {parent}`")
    if kind is Kind.ROOT:  # step directories, but none named as asked or none finished
        hint = _naming_hint(kv)
        if hint:
            raise UsageError(f"{url} holds no steps named as asked, but {hint}")
        return
    raise CliError(f"{url} holds no checkpoint steps (not a CheckpointManager root)")


def run(args: argparse.Namespace) -> int:
    """Print the steps."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint.layout import list_items
    from ocdbt_py.checkpoint.manager.naming import StepNameFormat
    from ocdbt_py.checkpoint.manager.steps import BadStepWarning, scan
    from ocdbt_py.kvstore import open_kvstore
    from ocdbt_py.kvstore.prefixed import PrefixStore

    with value_errors_as_usage():
        fmt = StepNameFormat(args.prefix, args.width)
    kv = open_kvstore(normalize_url(args.url), storage_options(args), read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BadStepWarning)
        names, infos = scan(kv, fmt)
    for w in caught:  # a step whose metadata cannot be used is left out, and said so
        if issubclass(w.category, BadStepWarning):
            sys.stderr.write(f"warning: {w.message}\n")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not names:
        _not_a_root(args.url, kv)
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
