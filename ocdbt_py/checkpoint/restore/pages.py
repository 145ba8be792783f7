"""Choosing the page size of restore outputs: ordinary pages unless asked otherwise.

A restore writes every byte of its outputs exactly once, and the first touch of fresh memory
costs a page fault per page: with ordinary 4 KiB pages ~0.5 s per GiB on the development VM
(a third of a 64 MiB chunk's decode time), with transparent huge pages (THP, 2 MiB) ~0.13 s
per GiB *when the 2 MiB blocks the kernel hands out are warm*.  NumPy asks for THP
(``madvise(MADV_HUGEPAGE)``) on every allocation of 4 MiB or more, and on this VM that is a
gamble: with THP ``defrag`` ``madvise`` the faulting thread compacts memory when no block is
free, and free blocks are often memory the VM's host has not backed yet (a Firecracker guest),
whose first touch costs more than the faults saved.  Measured in fresh processes (the
benchmark's own worker), alternating with ordinary pages, within a few minutes of each other:
256 MiB in 4 arrays 0.138-0.141 s vs 0.180-0.204 s in one run, 0.28-0.63 s vs 0.18-0.34 s in
the next; 1 GiB in 8 arrays 0.84-0.89 s vs 0.70-0.73 s.  So outputs get ordinary pages by default.

``OCDBT_PY_HUGEPAGES``: unset or ``0``, ordinary pages; ``1``, NumPy's default (THP);
``auto``, THP when it cannot stall on compaction, i.e. the kernel's THP defrag mode never
compacts on a fault, or ``/proc/buddyinfo`` shows free 2 MiB blocks for at least twice the
bytes about to be allocated, and at most :data:`HUGE_MAX` bytes of them (for machines whose
memory is backed up front, where that is a clear gain).

The switch is NumPy's process-wide flag; it is held in the requested state while at least one
restore is allocating (a request for ordinary pages wins over one for huge pages, as it is the
safe choice), and what was found is put back when the last one leaves.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["small_pages", "output_pages", "huge_pages_free", "HUGE_MIN", "HUGE_MAX"]

#: NumPy requests THP only for allocations at least this large
HUGE_MIN = 4 << 20
#: Restores with more outputs than this use ordinary pages (see the module docstring)
HUGE_MAX = 512 << 20
_HUGE = 2 << 20

_lock = threading.Lock()
_small = 0  # holders wanting ordinary pages
_huge = 0  # holders wanting NumPy's huge pages
_saved: bool | None = None


def _switch() -> Callable[[bool], bool] | None:

    for mod in ("_core", "core"):
        ma: Any = getattr(getattr(np, mod, None), "multiarray", None)
        fn = getattr(ma, "_set_madvise_hugepage", None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(64 << 10)
    except OSError:
        return ""


def huge_pages_free() -> int:
    """Free 2 MiB blocks the kernel can hand out without compacting (from ``/proc/buddyinfo``;
    0 where it cannot be read)."""
    total = 0
    for line in _read("/proc/buddyinfo").splitlines():
        counts = line.split()[4:]  # "Node 0, zone Normal c0 c1 ... c10"
        for order, c in enumerate(counts):
            if order >= 9 and c.isdigit():
                total += int(c) << (order - 9)
    return total


def _faults_never_stall() -> bool:
    """True when the THP ``defrag`` mode never compacts memory in the faulting thread."""
    mode = _read("/sys/kernel/mm/transparent_hugepage/defrag")
    return "[never]" in mode or "[defer]" in mode


def _want_huge(nbytes: int) -> bool:
    env = os.environ.get("OCDBT_PY_HUGEPAGES", "")
    if env != "auto":
        return env not in ("", "0")
    if nbytes < HUGE_MIN or nbytes > HUGE_MAX:
        return False
    if "[never]" in _read("/sys/kernel/mm/transparent_hugepage/enabled"):
        return False
    return _faults_never_stall() or huge_pages_free() * _HUGE >= 2 * nbytes


def _apply(fn: Callable[[bool], bool]) -> None:
    # called with _lock held: the flag follows the holders, or goes back to what was found
    global _saved
    if _small or _huge:
        old = bool(fn(_small == 0))
        if _saved is None:
            _saved = old
    elif _saved is not None:
        fn(_saved)
        _saved = None


@contextlib.contextmanager
def _hold(huge: bool) -> Iterator[None]:
    global _small, _huge
    fn = _switch()
    if fn is None:
        yield
        return
    with _lock:
        if huge:
            _huge += 1
        else:
            _small += 1
        _apply(fn)
    try:
        yield
    finally:
        with _lock:
            if huge:
                _huge -= 1
            else:
                _small -= 1
            _apply(fn)


@contextlib.contextmanager
def output_pages(nbytes: int) -> Iterator[None]:
    """Within the block, NumPy allocations use huge pages if about ``nbytes`` of outputs (of
    at least :data:`HUGE_MIN` each) can have them without the kernel compacting memory, and
    ordinary pages otherwise."""
    with _hold(_want_huge(nbytes)):
        yield


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """Within the block, NumPy allocations do not request transparent huge pages (unless
    ``OCDBT_PY_HUGEPAGES=1``)."""
    if os.environ.get("OCDBT_PY_HUGEPAGES", "") not in ("", "0", "auto"):
        yield
        return
    with _hold(False):
        yield
