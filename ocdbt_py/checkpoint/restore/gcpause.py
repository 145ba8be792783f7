"""Pausing Python's cyclic garbage collector while building large object trees.

Parsing ``_METADATA`` of a 10k-parameter model creates hundreds of thousands of small objects
in a burst; the cyclic collector then runs over and over on objects that are all alive,
which can double the time taken.  Automatic collection is paused for the duration (nesting
and threads are handled with a counter) and resumes afterwards; nothing is leaked, since
cycles are still collected at the next automatic or explicit collection.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable automatic garbage collection inside the ``with`` block."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
