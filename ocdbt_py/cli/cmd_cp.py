"""``ocdbt cp SRC DST``: copy an Orbax checkpoint, converting its layout on the way.

Per-parameter <-> OCDBT, Zarr v2 <-> v3, new chunk shapes, data file sizes, zstd levels and
float dtypes, between any fsspec filesystems; streamed (about ``--workers`` chunks in
flight), atomic per item/step, resumable, verifiable.  See
:func:`ocdbt_py.checkpoint.convert.api.copy`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ocdbt_py.cli.errors import CliError, UsageError, value_errors_as_usage
from ocdbt_py.cli.options import add_location, add_progress, parse_storage_option, size_arg
from ocdbt_py.cli.output import human_bytes, print_json
from ocdbt_py.cli.progress import Progress, progress_enabled

__all__ = ["register", "run"]


def _steps(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected step numbers like 100,200, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``cp`` subcommand."""
    p = subparsers.add_parser(
        "cp",
        help="copy a checkpoint into another layout, codec, chunking or store",
        description="Copy an Orbax checkpoint (item directory, step directory, or CheckpointManager root: "
        "every step unless --steps) from SRC to DST, any fsspec URLs. Without options the layout is kept "
        "and chunks are copied as bytes. Each item or step appears at DST only when complete; --resume "
        "continues an interrupted copy.",
    )
    add_location(p, dest="src", metavar="SRC", help="checkpoint to copy")
    add_location(p, dest="dst", metavar="DST", must_exist=False,
                 help="where the copy goes (must not exist unless --force/--resume)")
    p.add_argument("--ocdbt", action=argparse.BooleanOptionalAction, default=None,
                   help="OCDBT (--ocdbt) or per-parameter directories (--no-ocdbt); default: as SRC")
    z = p.add_mutually_exclusive_group()
    z.add_argument("--zarr3", dest="zarr3", action="store_true", default=None, help="write Zarr v3 arrays")
    z.add_argument("--zarr2", dest="zarr3", action="store_false", help="write Zarr v2 arrays")
    p.add_argument("--chunk-byte-size", type=size_arg, default=None, metavar="N",
                   help="re-chunk arrays as Orbax's SaveArgs(chunk_byte_size=N) does")
    p.add_argument("--target-data-file-size", type=size_arg, default=None, metavar="N",
                   help="OCDBT data file size (Orbax's ocdbt_target_data_file_size; 0: unlimited)")
    p.add_argument("--compression", default=None, metavar="zstd:LEVEL|none",
                   help="compression of the copy (default: as SRC)")
    p.add_argument("--dtype", default=None, metavar="DTYPE",
                   help="cast floating-point arrays, e.g. bfloat16, float16, float32")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="copy only arrays whose name matches one GLOB (repeatable)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                   help="leave out arrays whose name matches GLOB (repeatable)")
    p.add_argument("--steps", type=_steps, default=None, metavar="N,M",
                   help="steps of a manager root to copy (default: all)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads, also the bound on chunks in memory (default: cores, 4..16)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted copy")
    p.add_argument("--verify", action="store_true",
                   help="compare the copy with SRC before committing it (CRCs of chunks copied as bytes, "
                   "every value otherwise)")
    p.add_argument("--force", action="store_true", help="replace an existing DST")
    p.add_argument("--no-sync", dest="sync", action="store_false",
                   help="do not fsync local files (faster, not crash-durable)")
    p.add_argument("--dst-storage-option", metavar="K=V", action="append", default=[],
                   type=parse_storage_option, help="fsspec storage option for DST (repeatable; replaces -S for DST)")
    add_progress(p)
    p.set_defaults(func=run)


def _summary_line(s: dict[str, Any]) -> str:
    secs = max(s["seconds"], 1e-9)
    rate = s["logical_bytes"] / secs / 1e9
    units = s["units"]
    skipped = sum(u["status"] == "skipped" for u in units)
    parts = [f"copied {s['arrays']} arrays ({human_bytes(s['logical_bytes'])}) in {s['seconds']:.1f}s "
             f"({rate:.2f} GB/s)",
             f"chunks: {s['chunks_bytes']} as bytes, {s['chunks_rewrapped']} rewrapped, "
             f"{s['chunks_transcoded']} recompressed, {s['chunks_encoded']} re-encoded"]
    if s["arrays_resumed"] or skipped:
        parts.append(f"resumed: {s['arrays_resumed']} arrays already copied, {skipped} step(s) skipped")
    if s["verified"]:
        parts.append("verified")
    return "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Copy."""
    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint.convert.api import copy

    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    so = dict(args.storage_option) or None
    dso = dict(args.dst_storage_option) or None
    bar = Progress("cp", enabled=progress_enabled(args))

    def progress(done: int, total: int, unit: str) -> None:
        bar.update(done, total, unit)

    # heavy (numpy, the store, codecs): imported when the command runs, so `ocdbt --help` stays fast
    from ocdbt_py.checkpoint.saving.atomic import CheckpointExistsError

    try:
        with value_errors_as_usage():
            summary = copy(
                args.src, args.dst, use_ocdbt=args.ocdbt, use_zarr3=args.zarr3,
                chunk_byte_size=args.chunk_byte_size, ocdbt_target_data_file_size=args.target_data_file_size,
                compression=args.compression, dtype=args.dtype, include=args.include, exclude=args.exclude,
                steps=args.steps, workers=args.workers, resume=args.resume, verify=args.verify, force=args.force,
                sync=args.sync, storage_options=so, dst_storage_options=dso, progress=progress,
            )
    except CheckpointExistsError as e:
        raise CliError(f"{str(e).split(';')[0]}: pass --force to replace it, or --resume to finish an "
                       f"interrupted copy into it") from e
    finally:
        bar.close()
    if args.json:
        print_json(summary)
    else:  # the result, on stdout like every command's
        sys.stdout.write(_summary_line(summary) + "\n")
    return 0
