"""``ocdbt du``: logical and stored bytes per tensor and per subtree, compression ratio and
the OCDBT data files' sizes (metadata and B+tree only, no array data)."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.errors import UsageError, value_errors_as_usage
from ocdbt_py.cli.inspect_args import add_inspect_common
from ocdbt_py.cli.options import add_location, storage_options
from ocdbt_py.cli.output import human_bytes, out, print_json, print_table

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``du`` subcommand."""
    p = subparsers.add_parser(
        "du",
        help="bytes in memory and on storage per tensor and subtree of a checkpoint",
        description="Show where a checkpoint's bytes are: per tensor (or per subtree with --depth) its "
        "size in memory and stored (compressed), the compression ratio, and the sizes of the OCDBT data "
        "files. Reads no array data.",
    )
    add_location(p)
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="sum per subtree of the first N dotted name parts instead of per tensor")
    p.add_argument("--files", action="store_true", help="also list every data file (default: a summary)")
    add_inspect_common(p, workers=False, progress=False)
    p.set_defaults(func=run)


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def run(args: argparse.Namespace) -> int:
    """Print the usage."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.inspect.du import du, subtree_usage

    if args.depth is not None and args.depth < 1:
        raise UsageError("--depth needs a number >= 1 (leave it out for one row per tensor)")
    with value_errors_as_usage():
        usage = du(args.url, step=args.step, storage_options=storage_options(args), include=args.include or None)
    rows = usage.tensors if args.depth is None else subtree_usage(usage, args.depth)
    if args.json:
        print_json({name: u.to_json() for name, u in rows.items()})
        return 0
    stream = out()
    if usage.step is not None:
        stream.write(f"step {usage.step}\n")

    def hb(n: int | None) -> str:
        return "?" if n is None else human_bytes(n)

    table = [[name or "(root)", hb(u.logical_bytes), hb(u.stored_bytes), _ratio(u.ratio)]
             + ([str(u.arrays)] if args.depth is not None else []) for name, u in rows.items()]
    head = ("NAME", "LOGICAL", "STORED", "RATIO") + (("ARRAYS",) if args.depth is not None else ())
    print_table(head, table, (False, True, True, True, True))
    t = usage.total
    stream.write(f"total: {t.arrays} arrays, {hb(t.logical_bytes)} in memory, {hb(t.stored_bytes)} stored "
                 f"({_ratio(t.ratio)})\n")
    files = usage.data_files
    if files:
        stream.write(f"data files: {len(files)}, {human_bytes(sum(files.values()))}"
                     f" (largest {human_bytes(max(files.values()))})\n")
        if args.files:
            print_table(("FILE", "SIZE"), [[k, human_bytes(v)] for k, v in files.items()], (False, True))
    return 0
