"""Fast host copies of the arrays an asynchronous save will read later.

Copying a large tree is dominated by page faults on the fresh destination memory (on VMs a
1 GiB ``np.array(x, copy=True)`` can take seconds).  All copies go into one anonymous mapping
advised for transparent huge pages (512x fewer faults where the kernel allows it), in pieces
spread over a few threads (``np.copyto`` releases the GIL).  The mapping is released when
the last copied array is garbage, or kept for the next asynchronous save when the caller
asks (:func:`keep_arena`): a training loop saving the same tree again then copies into memory
that is already mapped, at memcpy speed.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import mmap
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ocdbt_py.pools import shared

__all__ = ["copy_arrays", "keep_arena", "release_cached_arena"]

_ALIGN = 64
#: Copies are cut into pieces of at most about this size, taken in turn by the copying threads
_PIECE = 4 << 20
_lock = threading.Lock()
_cached: np.ndarray | None = None


def keep_arena(arena: np.ndarray) -> None:
    """Keep ``arena`` (no longer used) for the next :func:`copy_arrays` with ``reuse``."""
    global _cached
    with _lock:
        _cached = arena


def release_cached_arena() -> None:
    """Free the buffer kept for the next asynchronous save, if any."""
    global _cached
    with _lock:
        _cached = None


def _take_cached(nbytes: int) -> np.ndarray | None:
    global _cached
    with _lock:
        arena, _cached = _cached, None
    if arena is not None and arena.nbytes >= nbytes and arena.nbytes <= 2 * nbytes + (64 << 20):
        return arena
    return None


def _arena(nbytes: int) -> np.ndarray:
    """A writable uint8 buffer of ``nbytes`` (huge-page advised when possible)."""
    if nbytes >= (8 << 20) and hasattr(mmap, "MAP_ANONYMOUS"):
        try:
            m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            advice = getattr(mmap, "MADV_HUGEPAGE", None)
            if advice is not None:
                try:
                    m.madvise(advice)
                except OSError:
                    pass
            return np.frombuffer(m, dtype=np.uint8)
        except (OSError, ValueError):
            pass
    return np.empty(max(nbytes, 1), dtype=np.uint8)


def copy_arrays(
    arrays: Sequence[np.ndarray], workers: int = 2, *, reuse: bool = False
) -> tuple[list[np.ndarray], np.ndarray]:
    """C-contiguous copies of ``arrays`` (same dtypes and shapes), made concurrently, and the
    buffer holding them (``reuse``: the kept buffer of an earlier save when it fits)."""
    offsets: list[int] = []
    total = 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    arena = (_take_cached(total) if reuse else None)
    if arena is None:
        arena = _arena(total)
    outs: list[np.ndarray] = []
    jobs: list[tuple[np.ndarray, Any]] = []
    for a, off in zip(arrays, offsets):
        dst = arena[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        outs.append(dst)
        if a.ndim == 0 or a.nbytes <= _PIECE:
            jobs.append((dst, a))
            continue
        rows = max(1, _PIECE // max(1, a.nbytes // a.shape[0]))
        for start in range(0, a.shape[0], rows):
            jobs.append((dst[start:start + rows], a[start:start + rows]))
    pieces = _pieces(jobs)
    n = max(1, min(workers, 4, len(pieces)))
    if n == 1:
        for dst, src in jobs:
            np.copyto(dst, src)
    else:  # the caller copies too
        order = itertools.count()
        futures = [_copy_pool().submit(_copy_pieces, pieces, order) for _ in range(n - 1)]
        _copy_pieces(pieces, order)
        for f in futures:
            f.result()
    return outs, arena


def _pieces(jobs: list[tuple[np.ndarray, Any]]) -> list[list[tuple[np.ndarray, Any]]]:
    """``jobs`` in order, grouped into pieces of up to about :data:`_PIECE` bytes (small
    arrays together: one turn per piece, not per array)."""
    out: list[list[tuple[np.ndarray, Any]]] = []
    size = _PIECE
    for job in jobs:
        n = job[0].nbytes
        if size + n > _PIECE:
            out.append([])
            size = 0
        out[-1].append(job)
        size += n
    return out


def _copy_pieces(pieces: Sequence[list[tuple[np.ndarray, Any]]], order: Iterator[int]) -> None:
    """Copy the pieces whose turn comes up in ``order`` (shared by the copying threads) until
    none is left.  Each thread takes the next piece when it is free, so one that starts late
    or runs slow (a vCPU the host preempts) leaves its share to the others instead of holding
    up the whole copy: in the ``bench_manager.py`` loop, the 304 MiB model split into two
    halves up front took p50 21 / p90 28 / max 77 ms."""
    for i in order:  # next() of an itertools.count is atomic
        if i >= len(pieces):
            return
        for dst, src in pieces[i]:
            np.copyto(dst, src)


def _copy_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Threads kept for copies between saves (starting threads per save costs milliseconds)."""
    return shared("copy")
