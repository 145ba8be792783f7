"""``ocdbt export``: stream an Orbax checkpoint's arrays into ``.safetensors`` or ``.npz``.

Tensors are named by their dotted path (``params.layer0.kernel``); peak memory is about one
slab of one tensor, not the model.
"""

from __future__ import annotations

import argparse
import fnmatch
from typing import Any

from ocdbt_py.cli.errors import value_errors_as_usage
from ocdbt_py.cli.options import add_location, storage_options

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``export`` subcommand."""
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint's arrays to a .safetensors or .npz file (streamed)",
        description="Export every array of an Orbax checkpoint (item directory, step directory, or "
        "CheckpointManager root: latest step unless --step) into one .safetensors or .npz file, one "
        "tensor at a time. Tensors are named by their dotted path; items of a step directory get "
        "their item name in front.",
    )
    add_location(p)
    p.add_argument("out", metavar="OUT", help="output file: .safetensors or .npz (or pass --format)")
    p.add_argument("--format", choices=("safetensors", "npz"), default=None,
                   help="output format (default: from OUT's suffix)")
    p.add_argument("--dtype", default=None, metavar="DTYPE",
                   help="cast floating-point tensors, e.g. bfloat16, float16, float32")
    p.add_argument("--step", type=int, default=None, metavar="N", help="step of a manager root (default: latest)")
    p.add_argument("--item", default=None, metavar="NAME", help="only this item of a step directory")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out tensors whose name matches GLOB (repeatable)")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="export only tensors whose name matches one GLOB (repeatable)")
    p.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                   help="replace the name prefix OLD with NEW (repeatable; the first match wins)")
    p.add_argument("--compress", action="store_true", help="deflate .npz members")
    p.set_defaults(func=run)


def _renamer(args: argparse.Namespace) -> Any:
    from ocdbt_py.cli.errors import UsageError

    pairs = []
    for r in args.rename:
        old, sep, new = r.partition("=")
        if not sep:
            raise UsageError(f"--rename expects OLD=NEW, got {r!r}")
        pairs.append((old, new))

    def rename(name: str) -> str | None:
        if args.include and not any(fnmatch.fnmatchcase(name, g) for g in args.include):
            return None
        if any(fnmatch.fnmatchcase(name, g) for g in args.exclude):
            return None
        for old, new in pairs:
            if name.startswith(old):
                return new + name[len(old):]
        return name

    return rename


def run(args: argparse.Namespace) -> int:
    """Write the file."""
    import time
    import warnings

    from ocdbt_py.checkpoint import UncommittedStepWarning, export_npz, export_safetensors
    from ocdbt_py.cli.errors import UsageError
    from ocdbt_py.cli.output import human_bytes

    fmt = args.format
    if fmt is None:
        if args.out.endswith(".safetensors"):
            fmt = "safetensors"
        elif args.out.endswith(".npz"):
            fmt = "npz"
        else:
            raise UsageError(f"cannot tell the format of {args.out!r}: name it .safetensors or .npz, or pass --format")
    t0 = time.monotonic()
    kw = {"dtype": args.dtype, "rename": _renamer(args), "item": args.item, "step": args.step,
          "storage_options": storage_options(args)}
    with warnings.catch_warnings(record=True) as caught, value_errors_as_usage():
        warnings.simplefilter("always", UncommittedStepWarning)
        if fmt == "safetensors":
            names = export_safetensors(args.url, args.out, **kw)
        else:
            names = export_npz(args.url, args.out, compress=args.compress, **kw)
    import os
    import sys

    from ocdbt_py.cli.output import print_json

    notes = [str(w.message) for w in caught]
    if not args.quiet:
        for note in notes:
            sys.stderr.write(f"ocdbt: note: {note}\n")
    size = os.path.getsize(args.out)
    seconds = time.monotonic() - t0
    if args.json:
        print_json({"output": args.out, "format": fmt, "tensors": len(names), "names": list(names),
                    "bytes": size, "seconds": round(seconds, 3), "notes": notes})
    else:
        sys.stdout.write(f"wrote {len(names)} tensors, {human_bytes(size)} to {args.out} in {seconds:.1f}s\n")
    return 0
