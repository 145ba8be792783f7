"""``ocdbt tree``: an Orbax checkpoint's tree of leaves with shape, dtype, bytes and chunking.

Works on an item directory, a step directory (every item) and a CheckpointManager root (the
latest finalized step, or ``--step N``).  Reads metadata only, never array data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import warnings
from typing import Any

from ocdbt_py.cli.errors import value_errors_as_usage
from ocdbt_py.cli.options import add_json, add_location, storage_options
from ocdbt_py.cli.output import human_bytes, out, print_json, print_table

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``tree`` subcommand."""
    p = subparsers.add_parser(
        "tree",
        help="show an Orbax checkpoint's tree: shape, dtype, bytes and chunking per leaf",
        description="Show the tree of an Orbax checkpoint (an item directory, a step directory with "
        "several items, or a CheckpointManager root: latest finalized step unless --step) with each "
        "leaf's dtype, shape, size in memory, size stored and chunk shape. Reads no array data.",
    )
    add_location(p)
    p.add_argument("--step", type=int, default=None, metavar="N", help="step of a manager root (default: latest)")
    p.add_argument("--item", default=None, metavar="NAME", help="only this item of a step directory")
    p.add_argument("--depth", type=int, default=None, metavar="D", help="show at most D levels")
    add_json(p)
    p.set_defaults(func=run)


def _fmt_shape(shape: Any) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _leaf_row(md: Any) -> list[str]:
    if md.kind in ("array", "scalar"):
        chunks = "x".join(str(c) for c in md.chunks) if md.chunks else "-"
        codecs = "/".join(c for c in md.codecs if c not in ("bytes", "crc32c", "sharding_indexed")) or "raw"
        stored = human_bytes(md.stored_bytes) if md.stored_bytes is not None else "?"
        typ = f"{md.dtype}{_fmt_shape(md.shape)}" + (" (scalar)" if md.kind == "scalar" else "")
        return [typ, human_bytes(md.nbytes), stored, chunks, codecs]
    if md.kind == "string":
        return [f"str {md.value!r}"[:60], "", "", "", ""]
    if md.kind == "inline":
        v = md.value
        if md.shape is not None:
            return [f"{md.dtype}{_fmt_shape(md.shape)} (inline)", human_bytes(md.nbytes or 0), "", "", "msgpack"]
        return [f"{type(v).__name__} {v!r} (inline)"[:60], "", "", "", "msgpack"]
    return [repr(md.value), "", "", "", ""]


def _rows(tree: Any, depth: int | None) -> tuple[list[list[str]], dict[str, int]]:
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint import LeafMetadata

    rows: list[list[str]] = []
    totals = {"leaves": 0, "arrays": 0, "nbytes": 0, "stored": 0, "stored_known": 1}

    def walk(node: Any, prefix: str, level: int) -> None:
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for i, (k, v) in enumerate(items):
            last = i == len(items) - 1
            branch = "└── " if last else "├── "
            name = f"{prefix}{branch}{k}"
            nxt = prefix + ("    " if last else "│   ")
            if isinstance(v, LeafMetadata):
                rows.append([name, *_leaf_row(v)])
                totals["leaves"] += 1
                if v.kind in ("array", "scalar"):
                    totals["arrays"] += 1
                    totals["nbytes"] += v.nbytes or 0
                    if v.stored_bytes is None:
                        totals["stored_known"] = 0
                    else:
                        totals["stored"] += v.stored_bytes
            elif isinstance(v, (dict, list)) and v and not _has_leaf_metadata(v):
                rows.append([name, "JSON " + _json_text(v), "", "", "", ""])  # a JSON item
            elif isinstance(v, (dict, list)) and v:
                n = _count(v)
                rows.append([name, f"({n} leaves)" if n != 1 else "(1 leaf)", "", "", "", ""])
                if depth is None or level + 1 < depth:
                    walk(v, nxt, level + 1)
            else:  # JSON item content or an empty container
                text = _json_text(v)
                rows.append([name, text, "", "", "", ""])

    walk(tree if isinstance(tree, (dict, list)) else {"": tree}, "", 0)
    return rows, totals


def _has_leaf_metadata(v: Any) -> bool:
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint import LeafMetadata

    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, LeafMetadata):
            return True
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


def _count(v: Any) -> int:
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint import LeafMetadata

    if isinstance(v, LeafMetadata):
        return 1
    if isinstance(v, dict):
        return sum(_count(x) for x in v.values())
    if isinstance(v, list):
        return sum(_count(x) for x in v)
    return 1


def _json_text(v: Any) -> str:
    try:
        s = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _to_json(tree: Any) -> Any:
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint import LeafMetadata

    if isinstance(tree, LeafMetadata):
        d = dataclasses.asdict(tree)
        d["dtype"] = None if tree.dtype is None else str(tree.dtype)
        d["path"] = list(tree.path)
        for k in ("shape", "chunks", "write_shape", "codecs"):
            if d.get(k) is not None:
                d[k] = list(d[k])
        d["value"] = _jsonable(tree.value)
        return {"__leaf__": True, **d}
    if isinstance(tree, dict):
        return {str(k): _to_json(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_json(v) for v in tree]
    return _jsonable(tree)


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return repr(v)


def run(args: argparse.Namespace) -> int:
    """Print the tree."""

    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint import UncommittedStepWarning, metadata
    from ocdbt_py.checkpoint.restore.api import resolve

    opts = storage_options(args)
    skipped: list[str] = []
    with warnings.catch_warnings(record=True) as caught, value_errors_as_usage():
        warnings.simplefilter("always", UncommittedStepWarning)
        r = resolve(args.url, step=args.step, storage_options=opts)
        tree = metadata(r.kv, item=args.item)
    skipped = [str(w.message) for w in caught if issubclass(w.category, UncommittedStepWarning)]
    if args.json:
        print_json({"step": r.step, "tree": _to_json(tree), "skipped": skipped})
        return 0
    stream = out()
    if r.step is not None:
        # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
        from ocdbt_py.checkpoint import list_steps

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = [s.step for s in list_steps(args.url, storage_options=opts)]
        shown = ", ".join(str(s) for s in steps[-10:])
        stream.write(f"step {r.step} (steps: {'..., ' if len(steps) > 10 else ''}{shown})\n")
    for msg in skipped:
        stream.write(f"note: {msg}\n")
    rows, totals = _rows(tree, args.depth)
    print_table(["NAME", "TYPE", "BYTES", "STORED", "CHUNKS", "CODECS"], rows, [False, False, True, True, False, False])
    stored = human_bytes(totals["stored"]) if totals["stored_known"] else "?"
    stream.write(f"{totals['arrays']} arrays, {human_bytes(totals['nbytes'])} in memory, {stored} stored, "
                 f"{totals['leaves']} leaves\n")
    return 0
