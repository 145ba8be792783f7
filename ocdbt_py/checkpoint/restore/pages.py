"""Allocating restore outputs without transparent huge pages.

NumPy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every
allocation of 4 MiB or more.  Where the kernel's THP mode is ``madvise`` with synchronous
defragmentation (common on cloud VMs), the first touch of such memory may have to compact
memory to find free 2 MiB pages: on the development VM, filling a freshly allocated GiB took
anywhere from 0.2 s to 4 s depending on the state of the rest of the machine, against a steady
0.9 s with ordinary pages.  A restore writes every byte of its outputs exactly once, so it
allocates them with ordinary pages (``OCDBT_PY_HUGEPAGES=1`` restores NumPy's default).

The switch is NumPy's process-wide flag; :func:`small_pages` holds it off only while at least
one restore is reading (other threads allocating meanwhile get ordinary pages too), and puts
back what it found when the last one leaves.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["small_pages"]

_lock = threading.Lock()
_depth = 0
_saved: bool | None = None


def _switch() -> Callable[[bool], bool] | None:

    for mod in ("_core", "core"):
        ma: Any = getattr(getattr(np, mod, None), "multiarray", None)
        fn = getattr(ma, "_set_madvise_hugepage", None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    return None


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """Within the block, NumPy allocations do not request transparent huge pages."""
    global _depth, _saved
    if os.environ.get("OCDBT_PY_HUGEPAGES", "") not in ("", "0"):
        yield
        return
    fn = _switch()
    if fn is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = bool(fn(False))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                fn(_saved)
                _saved = None
