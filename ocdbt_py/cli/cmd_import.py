"""``ocdbt import``: safetensors (one file, a sharded index, or a directory) -> Orbax checkpoint.

Streamed tensor by tensor (peak memory about one tensor); dotted names become nested dicts;
bfloat16 and float8 are kept.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ocdbt_py.cli.errors import CliError, UsageError, value_errors_as_usage
from ocdbt_py.cli.inspect_args import progress_callback
from ocdbt_py.cli.options import add_location, add_progress, name_map_arg, parse_storage_option, storage_options
from ocdbt_py.cli.output import print_json
from ocdbt_py.units import parse_size

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``import`` subcommand."""
    p = subparsers.add_parser(
        "import",
        help="write safetensors (file, sharded index or directory) into an Orbax checkpoint (streamed)",
        description="Import a .safetensors file, a Hugging Face *.safetensors.index.json, or a directory "
        "holding either (local path or fsspec URL) into a new Orbax checkpoint at DST (OCDBT with Zarr v2 "
        "chunks, as Orbax writes by default). Dotted tensor names become nested dicts; one tensor is in "
        "memory at a time.",
    )
    add_location(p, metavar="SRC", file_ok=True,
                 help="a .safetensors file, a *.safetensors.index.json, or a directory holding either "
                 "(local path or fsspec URL; -S options apply to it)")
    add_location(p, dest="dst", metavar="DST", must_exist=False,
                 help="the checkpoint directory to create (local path or fsspec URL)")
    p.add_argument("--zarr3", action="store_true", help="store Zarr v3 chunks (Orbax's use_zarr3=True)")
    p.add_argument("--chunk-byte-size", default=None, metavar="SIZE",
                   help="largest chunk, as Orbax's SaveArgs.chunk_byte_size (bytes, or 64MB, 16MiB, ...)")
    p.add_argument("--no-compression", action="store_true", help="store chunks uncompressed (default: zstd)")
    p.add_argument("--map", default=None, metavar="FILE",
                   help="JSON (or YAML, with PyYAML) file of regex renames [[pattern, replacement|null], ...] "
                   "applied in order before names are nested")
    p.add_argument("--force", action="store_true", help="replace an existing checkpoint at DST")
    p.add_argument("--dst-option", metavar="K=V", action="append", default=[], type=parse_storage_option,
                   help="fsspec storage option for DST (repeatable; -S applies to the source)")
    add_progress(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the checkpoint."""
    # the checkpoint engine loads when the command runs, so `ocdbt --help` stays quick
    from ocdbt_py.bridges import import_safetensors

    chunk: int | None = None
    if args.chunk_byte_size is not None:
        try:
            chunk = parse_size(args.chunk_byte_size)
        except ValueError as e:
            raise UsageError(f"--chunk-byte-size: {e}") from e
    name_map = name_map_arg(args.map)
    if name_map is not None and name_map.transpose:
        raise UsageError(f"--map {args.map}: 'transpose' applies to export only")
    dst_opts: dict[str, Any] | None = dict(args.dst_option) or None
    # with the engine (heavy): the error a refused overwrite raises
    from ocdbt_py.checkpoint.saving.atomic import CheckpointExistsError

    t0 = time.monotonic()
    try:
        with value_errors_as_usage(), progress_callback(args, "import") as progress:
            names = import_safetensors(args.url, args.dst, rename=name_map, use_zarr3=args.zarr3,
                                       chunk_byte_size=chunk, use_compression=not args.no_compression,
                                       force=args.force, storage_options=storage_options(args),
                                       dst_storage_options=dst_opts, progress=progress)
    except CheckpointExistsError as e:
        raise CliError(f"{args.dst} already exists: pass --force to replace it") from e
    seconds = time.monotonic() - t0
    if args.json:
        print_json({"tensors": len(names), "names": names, "checkpoint": args.dst, "seconds": seconds})
    else:
        sys.stdout.write(f"imported {len(names)} tensors into {args.dst} in {seconds:.1f}s\n")
    return 0
