"""Arguments and output helpers shared by ``ocdbt stats``, ``diff``, ``du`` and ``report``."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator

from ocdbt_py.cli import progress
from ocdbt_py.cli.errors import UsageError
from ocdbt_py.cli.options import add_json, add_progress, add_quiet
from ocdbt_py.cli.output import human_bytes

__all__ = ["add_inspect_common", "progress_callback", "check_workers", "fmt_num", "fmt_shape"]


def add_inspect_common(p: argparse.ArgumentParser, *, step: bool = True, include: bool = True,
                       workers: bool = True, progress: bool = True) -> None:
    """``--step``, ``--include GLOB``, ``--workers``, ``--quiet``, ``--json`` and (for commands
    that read every chunk) ``--progress/--no-progress``."""
    if step:
        p.add_argument("--step", type=int, default=None, metavar="N",
                       help="step of a CheckpointManager root (default: the latest)")
    if include:
        p.add_argument("--include", action="append", default=[], metavar="GLOB",
                       help="only tensors whose dotted name matches GLOB (repeatable, e.g. 'params.*')")
    if workers:
        p.add_argument("--workers", type=int, default=None, metavar="N",
                       help="decoding threads (default: CPU count)")
    add_quiet(p)  # both already there when add_location came first: added once
    add_json(p)
    if progress:
        add_progress(p)


@contextlib.contextmanager
def progress_callback(args: argparse.Namespace, label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A ``progress(done_bytes, total_bytes)`` drawing a bar on stderr (``--progress``, or by
    default when stderr is a terminal; never with ``--quiet``); ``None`` otherwise."""
    if not progress.progress_enabled(args):
        yield None
        return
    with progress.Progress(label, enabled=True) as bar:
        yield lambda done, total: bar.update(done, total, f"{human_bytes(done)} of {human_bytes(total)}")


def check_workers(args: argparse.Namespace) -> None:
    """``--workers`` must be positive."""

    if getattr(args, "workers", None) is not None and args.workers < 1:
        raise UsageError("--workers needs a positive number (or leave it out for the CPU count)")


def fmt_num(v: float | None) -> str:
    """A number in 6 significant digits (``-`` for none)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.6g}"


def fmt_shape(shape: tuple[int, ...] | list[int]) -> str:
    """``[3, 4]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"
