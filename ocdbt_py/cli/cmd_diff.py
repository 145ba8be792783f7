"""``ocdbt diff``: what changed between two checkpoints (or two steps of one manager root)."""

from __future__ import annotations

import argparse
import math

from ocdbt_py.cli.errors import UsageError, value_errors_as_usage
from ocdbt_py.cli.inspect_args import add_inspect_common, check_workers, fmt_num, fmt_shape, progress_callback
from ocdbt_py.cli.options import add_location, storage_options
from ocdbt_py.cli.output import out, print_json

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``diff`` subcommand."""
    p = subparsers.add_parser(
        "diff",
        help="compare two checkpoints tensor by tensor (exit 0 equal, 1 different)",
        description="Compare two Orbax checkpoints (items, steps or CheckpointManager roots, on any "
        "stores and in any layout): tensors added, removed, changed (shape, dtype or values, with the "
        "largest absolute and relative difference and the L2 norm of the difference) and unchanged. "
        "Chunks whose stored bytes are equal are not decoded. With one location, compare two of its "
        "steps (--step-a/--step-b). Exit status: 0 equal, 1 different, 2 usage error.",
    )
    add_location(p, dest="a", metavar="A", help="first checkpoint (local path or fsspec URL)")
    add_location(p, dest="b", metavar="B", optional=True,
                 help="second checkpoint (default: A again, for comparing two steps of a manager root)")
    p.add_argument("--step-a", type=int, default=None, metavar="N", help="step of A when it is a manager root")
    p.add_argument("--step-b", type=int, default=None, metavar="N", help="step of B when it is a manager root")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0: exact)")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance, of |B| (default 0: exact)")
    p.add_argument("--unchanged", action="store_true", help="also list the unchanged tensors (text output)")
    add_inspect_common(p, step=False)
    p.set_defaults(func=run)


def _details(d: dict[str, object]) -> str:
    if d["reason"] == "shape":
        return f"shape {fmt_shape(d['shape_a'])} -> {fmt_shape(d['shape_b'])}"  # type: ignore[arg-type]
    if d["reason"] == "dtype":
        return f"dtype {d['dtype_a']} -> {d['dtype_b']}"
    extra = f", {d['nonfinite_diff']} NaN/Inf mismatches" if d.get("nonfinite_diff") else ""
    return (f"{d['n_diff']} of {d['size']} values differ{extra}; max_abs_diff {fmt_num(d['max_abs_diff'])}"  # type: ignore[arg-type]
            f", max_rel_diff {fmt_num(d['max_rel_diff'])}, l2 {fmt_num(d['l2'])}")  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    """Print the differences; exit 1 when there are any."""

    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.inspect.diff import diff

    check_workers(args)
    for name in ("atol", "rtol"):
        v = getattr(args, name)
        if not math.isfinite(v) or v < 0:
            raise UsageError(f"--{name} needs a finite number >= 0, not {v}")
    b = args.b if args.b is not None else args.a
    if args.b is None and (args.step_a is None or args.step_b is None):
        raise UsageError("give two checkpoints (ocdbt diff A B), or one manager root with --step-a N --step-b M")
    opts_a, opts_b = storage_options(args, args.a), storage_options(args, b)  # -S for both, --timeout per scheme
    with value_errors_as_usage(), progress_callback(args, "diff") as progress:
        res = diff(args.a, b, step_a=args.step_a, step_b=args.step_b, atol=args.atol, rtol=args.rtol,
                   include=args.include or None, storage_options_a=opts_a, storage_options_b=opts_b,
                   workers=args.workers, progress=progress)
    if args.json:
        print_json(res.to_json())
        return 0 if res.equal else 1
    stream = out()
    for n in res.removed:
        stream.write(f"- {n}\n")
    for n in res.added:
        stream.write(f"+ {n}\n")
    for n, d in res.changed.items():
        stream.write(f"~ {n}: {_details(d)}\n")
    if args.unchanged:
        for n in res.unchanged:
            stream.write(f"= {n}\n")
    stream.write(f"{len(res.changed)} changed, {len(res.added)} added, {len(res.removed)} removed, "
                 f"{len(res.unchanged)} unchanged\n")
    return 0 if res.equal else 1
