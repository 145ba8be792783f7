"""``ocdbt stats``: per-tensor min, max, mean, std and NaN/Inf/zero counts of a checkpoint,
streamed chunk by chunk (never the whole model in memory)."""

from __future__ import annotations

import argparse

from ocdbt_py.cli.errors import value_errors_as_usage
from ocdbt_py.cli.inspect_args import add_inspect_common, check_workers, fmt_num, fmt_shape, progress_callback
from ocdbt_py.cli.options import add_location, storage_options
from ocdbt_py.cli.output import out, print_json, print_table

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``stats`` subcommand."""
    p = subparsers.add_parser(
        "stats",
        help="per-tensor min/max/mean/std and NaN/Inf/zero counts of a checkpoint",
        description="Read every chunk of an Orbax checkpoint (item, step or CheckpointManager root; "
        "any fsspec URL) once, in parallel, and print per tensor: shape, dtype, min, max, mean, std "
        "(over finite values, accumulated in float64) and the number of NaN, Inf and zero values. "
        "Tensors holding NaN or Inf are flagged first.",
    )
    add_location(p)
    add_inspect_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the statistics."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.inspect.stats import checksum_summary, stats

    check_workers(args)
    with value_errors_as_usage(), progress_callback(args, "stats") as progress:
        result = stats(args.url, include=args.include or None, step=args.step, storage_options=storage_options(args),
                       workers=args.workers, progress=progress)
    if args.json:
        print_json({name: s.to_json() for name, s in result.items()})
        return 0
    stream = out()
    bad = [s for s in result.values() if s.nonfinite]
    if bad:
        stream.write(f"!! {len(bad)} of {len(result)} tensors hold NaN or Inf:\n")
        for s in bad:
            stream.write(f"!!   {s.name}: {s.nan} NaN, {s.inf} Inf of {s.size}\n")
        stream.write("\n")
    rows = [["!!" if s.nonfinite else "", s.name, s.dtype, fmt_shape(s.shape), fmt_num(s.min), fmt_num(s.max),
             fmt_num(s.mean), fmt_num(s.std), str(s.nan), str(s.inf), str(s.zeros)] for s in result.values()]
    print_table(("", "NAME", "DTYPE", "SHAPE", "MIN", "MAX", "MEAN", "STD", "NAN", "INF", "ZEROS"), rows,
                (False, False, False, False, True, True, True, True, True, True, True))
    if not bad:
        stream.write(f"{len(result)} tensor{'' if len(result) == 1 else 's'}, no NaN or Inf\n")
    stream.write(checksum_summary(result.values()) + "\n")
    return 0
