"""The one owner of ocdbt-py's thread pools and their sizes.

Every layer that runs work on threads asks here instead of making its own executor:

* :func:`shared` gives a process-wide pool by purpose, created on first use and kept (starting
  threads costs milliseconds per call): ``"io"`` for blocking storage requests, ``"compute"``
  for codec work (one thread per core), ``"copy"`` for host copies of async saves.
* :func:`map_concurrently` runs a function over items on a shared pool with bounded
  concurrency and returns the results in order.  Called from a thread of that same pool it
  runs inline instead, so nested use can never exhaust the pool and deadlock.
* :func:`dedicated` makes a private executor whose threads belong to one owner (a store's
  HTTP connections, one save's encoder threads), sized from the same table.

Sizes live in :data:`SIZES`; ``OCDBT_PY_THREADS_<PURPOSE>`` (e.g. ``OCDBT_PY_THREADS_IO=32``)
overrides one before its pool is first used (``ZARR3_NUM_THREADS`` is the older name of
``OCDBT_PY_THREADS_COMPUTE``), and :func:`resize` changes one while the process runs.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread  # noqa: F401  (else loaded on first use: inside a restore)
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["SIZES", "size", "resize", "shared", "dedicated", "map_concurrently", "in_pool", "lower_thread_priority"]

T = TypeVar("T")
R = TypeVar("R")

#: Threads per purpose.  ``io``: blocking requests that mostly wait (network, disk);
#: ``compute``: codec work that releases the GIL (the decode/encode pool of ``zarr3.engine``,
#: which every array read and write and every checkpoint restore runs on);
#: ``write``: storage writes of encoded chunks (each may wait on fsync or the network);
#: ``copy``: memcpy-bound host copies; ``http``: one object store's keep-alive connections;
#: ``save``: one save's encoders; ``fsync``: syncing the files of a commit; ``read``: regions
#: of one restore read in parallel (each may wait on ``io`` and ``compute`` work, so it has its
#: own pool); ``inspect``: one stats/diff/du run's chunk tasks (fetch, decode, reduce).
SIZES: dict[str, int] = {
    "io": 16,
    "compute": max(1, os.cpu_count() or 1),
    "write": 8,
    "copy": 4,
    "http": 16,
    "save": max(1, os.cpu_count() or 1),
    "fsync": 8,
    "read": 4,
    "inspect": max(1, os.cpu_count() or 1),
}

#: Older environment variables still honoured for a purpose, after ``OCDBT_PY_THREADS_<PURPOSE>``.
ENV_ALIASES: dict[str, tuple[str, ...]] = {"compute": ("ZARR3_NUM_THREADS",), "http": ("OCDBT_PY_HTTP_THREADS",)}

_lock = threading.Lock()
_pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_resized: dict[str, int] = {}
_local = threading.local()


def size(purpose: str, default: int | None = None) -> int:
    """The number of threads for ``purpose``: set by :func:`resize`, else the environment
    (``OCDBT_PY_THREADS_<PURPOSE>``, then :data:`ENV_ALIASES`), else ``default`` if given
    (an owner with its own default, e.g. an object store's request limit), else :data:`SIZES`."""
    n = _resized.get(purpose)
    if n is not None:
        return n
    for var in (f"OCDBT_PY_THREADS_{purpose.upper()}", *ENV_ALIASES.get(purpose, ())):
        env = os.environ.get(var)
        if env:
            try:
                return max(1, int(env))
            except ValueError:
                pass
    return SIZES[purpose] if default is None else max(1, default)


def resize(purpose: str, n: int) -> None:
    """Give ``purpose`` ``n`` threads from now on (over the environment and :data:`SIZES`).
    Its shared pool, if made, is replaced on next use; work already queued on it still runs."""
    if n < 1:
        raise ValueError("need at least one thread")
    if purpose not in SIZES:
        raise KeyError(f"unknown pool purpose {purpose!r}")
    with _lock:
        _resized[purpose] = int(n)
        old = _pools.pop(purpose, None)
    if old is not None:
        old.shutdown(wait=False)


def _mark(purpose: str, nice: int = 0) -> None:
    _local.purpose = purpose
    if nice > 0:
        lower_thread_priority(nice)


def lower_thread_priority(nice: int) -> bool:
    """Raise the calling thread's nice value by ``nice`` (Linux: per thread; threads it starts
    inherit it).  Returns whether it was done; a no-op where unsupported."""
    get_id = getattr(threading, "get_native_id", None)
    if nice <= 0 or get_id is None or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return False
    try:
        tid = get_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        return False
    return True


def dedicated(purpose: str, workers: int | None = None, *, name: str | None = None, nice: int = 0
              ) -> concurrent.futures.ThreadPoolExecutor:
    """A new executor of ``workers`` threads (default: the size of ``purpose``) that its
    caller owns and shuts down; ``nice > 0`` runs its threads at that much lower priority
    (Linux), e.g. a background save's encoders next to a training loop."""
    n = max(1, workers if workers is not None else size(purpose))
    return concurrent.futures.ThreadPoolExecutor(
        n, thread_name_prefix=f"ocdbt-{name or purpose}", initializer=_mark, initargs=(purpose, nice))


def shared(purpose: str) -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide pool for ``purpose`` (created on first use, never shut down)."""
    with _lock:
        pool = _pools.get(purpose)
        if pool is None:
            pool = _pools[purpose] = dedicated(purpose)
        return pool


def in_pool(purpose: str) -> bool:
    """Whether the calling thread is a thread of a pool for ``purpose``."""
    return getattr(_local, "purpose", None) == purpose


def map_concurrently(fn: Callable[[T], R], items: Iterable[T], *, purpose: str = "io",
                     limit: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, run on the shared pool for ``purpose`` with at most
    ``limit`` (default: the pool's size) calls at once.  Runs inline for a single item or
    when called from a thread of that pool (nested use never waits on its own pool)."""
    todo = list(items)
    if len(todo) <= 1 or in_pool(purpose):
        return [fn(x) for x in todo]
    n = min(limit or size(purpose), len(todo))
    pool = shared(purpose)
    if n >= len(todo):
        return list(pool.map(fn, todo))
    sem = threading.BoundedSemaphore(n)

    def run(x: T) -> R:
        try:
            return fn(x)
        finally:
            sem.release()

    futures: list[concurrent.futures.Future[R]] = []
    try:
        for x in todo:
            sem.acquire()
            futures.append(pool.submit(run, x))
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()
