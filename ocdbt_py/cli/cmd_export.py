"""``ocdbt export``: stream an Orbax checkpoint's arrays into ``.safetensors`` or ``.npz``.

Tensors are named by their dotted path (``params.layer0.kernel``); peak memory is about one
slab of one tensor, not the model.  ``OUT`` a directory (or ``--max-shard-size``): Hugging
Face's sharded layout (``model-00001-of-0000N.safetensors`` + ``model.safetensors.index.json``,
or ``model.safetensors`` when it fits in one shard).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
import warnings
from typing import Any

from ocdbt_py.cli.errors import CliError, UsageError, value_errors_as_usage
from ocdbt_py.cli.inspect_args import progress_callback
from ocdbt_py.cli.options import add_json, add_location, add_progress, name_map_arg, storage_options
from ocdbt_py.cli.output import check_overwrite, human_bytes, print_json

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
    p.add_argument("out", metavar="OUT", help="output file (.safetensors or .npz, or pass --format), or a "
                   "directory for Hugging Face's sharded layout")
    p.add_argument("--max-shard-size", default=None, metavar="SIZE",
                   help="write OUT as a directory of shards of at most SIZE (5GB, 300KB, 2GiB or bytes; "
                   "default 5GB when OUT is a directory)")
    p.add_argument("--transpose", action="append", default=[], metavar="GLOB",
                   help="reverse the axes of tensors whose checkpoint name matches GLOB (a Flax (in, out) "
                   "kernel becomes PyTorch's (out, in)); repeatable")
    p.add_argument("--map", default=None, metavar="FILE",
                   help="JSON (or YAML, with PyYAML) file of regex renames [[pattern, replacement|null], ...] "
                   "applied in order after --rename, optionally {\"rename\": [...], \"transpose\": [globs]}")
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
    p.add_argument("--force", action="store_true", help="replace existing output files")
    add_json(p)
    add_progress(p)
    p.set_defaults(func=run)


def _renamer(args: argparse.Namespace, name_map: Any = None) -> Any:
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
                name = new + name[len(old):]
                break
        return name if name_map is None else name_map(name)

    return rename


def _format(args: argparse.Namespace) -> str:
    fmt = args.format
    is_dir = args.out.endswith(("/", os.sep)) or os.path.isdir(args.out)
    if args.max_shard_size is not None or (fmt is None and is_dir):
        if fmt == "npz":
            raise UsageError("--max-shard-size and directory output are for safetensors, not npz")
        return "safetensors-dir"
    if fmt is None:
        if args.out.endswith(".safetensors"):
            return "safetensors"
        if args.out.endswith(".npz"):
            return "npz"
        raise UsageError(f"cannot tell the format of {args.out!r}: name it .safetensors or .npz, make it a "
                         f"directory (ending in /), or pass --format / --max-shard-size")
    return str(fmt)


def _written_files(args: argparse.Namespace, fmt: str) -> list[str]:
    if fmt != "safetensors-dir":
        return [args.out]
    # with the engine, at run time (it pulls in the checkpoint reader)
    from ocdbt_py.bridges.safetensors_export import INDEX_NAME, SINGLE_NAME

    index = os.path.join(args.out, INDEX_NAME)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(args.out, n) for n in shards] + [index]
    return [os.path.join(args.out, SINGLE_NAME)]


def _refuse_overwrite(args: argparse.Namespace, fmt: str) -> None:
    """Without ``--force``, existing output is an error (the one overwrite rule of every command)."""
    if args.force:
        return
    if fmt == "safetensors-dir":
        existing = os.path.isdir(args.out) and [n for n in os.listdir(args.out) if n.endswith(
            (".safetensors", ".safetensors.index.json"))]
        if existing:
            raise CliError(f"{args.out} already holds safetensors files: pass --force to replace them")
        return
    check_overwrite(args.out, args.force)


def run(args: argparse.Namespace) -> int:
    """Write the file(s)."""
    # the checkpoint engine loads when the command runs, so `ocdbt --help` stays quick
    from ocdbt_py.bridges import export_safetensors
    from ocdbt_py.checkpoint import UncommittedStepWarning, export_npz

    fmt = _format(args)
    name_map = name_map_arg(args.map)
    transpose = list(args.transpose) + (list(name_map.transpose) if name_map is not None else [])
    if transpose and fmt == "npz":
        raise UsageError("--transpose applies to safetensors output")
    _refuse_overwrite(args, fmt)
    t0 = time.monotonic()
    kw: dict[str, Any] = {"dtype": args.dtype, "rename": _renamer(args, name_map), "item": args.item,
                          "step": args.step, "storage_options": storage_options(args)}
    with warnings.catch_warnings(record=True) as caught, value_errors_as_usage(), \
            progress_callback(args, "export") as progress:
        warnings.simplefilter("always", UncommittedStepWarning)
        if fmt == "npz":
            names = export_npz(args.url, args.out, compress=args.compress, progress=progress, **kw)
        else:
            shard = args.max_shard_size if args.max_shard_size is not None else (
                "5GB" if fmt == "safetensors-dir" else None)
            names = export_safetensors(args.url, args.out, max_shard_size=shard, transpose=transpose or None,
                                       progress=progress, **kw)
    notes = [str(w.message) for w in caught]
    if not args.quiet:
        for note in notes:
            sys.stderr.write(f"ocdbt: note: {note}\n")
    files = _written_files(args, fmt)
    size = sum(os.path.getsize(f) for f in files)
    seconds = time.monotonic() - t0
    if args.json:
        print_json({"output": args.out, "format": fmt, "tensors": len(names), "names": names, "files": files,
                    "bytes": size, "seconds": seconds, "notes": notes})
    else:
        where = args.out if len(files) == 1 else f"{args.out} ({len(files) - 1} shards + index)"
        sys.stdout.write(f"wrote {len(names)} tensors, {human_bytes(size)} to {where} in {seconds:.1f}s\n")
    return 0
