"""The worker pools (owned by :mod:`ocdbt_py.pools`) and the bounded fetch -> decode pipeline.

Chunks are fetched in batches with one concurrent :meth:`KvStore.get_many` per batch, while
worker threads decode the previous batches (zstd, zlib, blosc and NumPy copies release the
GIL).  At most ``max_pending`` decode jobs are queued, so the compressed bytes held in memory
stay bounded no matter how large the selection is.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ocdbt_py import pools
from ocdbt_py.kvstore import KvStore, validate_key
from ocdbt_py.kvstore.base import ByteRange
from ocdbt_py.kvstore.local import open_beneath

__all__ = [
    "get_pool",
    "num_threads",
    "set_num_threads",
    "run_pipeline",
    "run_jobs",
    "batched",
    "Job",
    "IoSink",
    "LocalFetcher",
]

Job = Callable[[], None]
T = TypeVar("T")


def num_threads() -> int:
    """Worker threads used for decoding and encoding: the size of the ``compute`` pool of
    :mod:`ocdbt_py.pools` (``pools.SIZES``: the CPU count; ``OCDBT_PY_THREADS_COMPUTE`` or the
    older ``ZARR3_NUM_THREADS`` override it)."""
    return pools.size("compute")


def set_num_threads(n: int) -> None:
    """Set the number of worker threads (takes effect for the next operation)."""
    pools.resize("compute", n)


def get_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide decode/encode pool (``pools.shared("compute")``)."""
    return pools.shared("compute")


def get_io_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide pool for storage writes (``pools.shared("write")``)."""
    return pools.shared("write")


class IoSink:
    """Runs storage writes on the I/O pool with at most ``max_pending`` queued.

    Encoding workers hand each encoded chunk over and go on encoding while the write (and
    its fsync) completes; :meth:`wait` blocks until everything is stored and re-raises the
    first failure.  With one thread configured, writes run inline.
    """

    def __init__(self, max_pending: int | None = None):
        self._inline = num_threads() == 1
        self._sem = threading.BoundedSemaphore(max_pending or 2 * num_threads() + 2)
        # only the writes not yet finished are kept (a write of a million chunks does not
        # keep a million futures, nor scan them on every submit), and the first failure
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._error: BaseException | None = None
        self._flock = threading.Lock()

    def _run(self, fn: Job) -> None:
        try:
            fn()
        except BaseException as e:
            with self._flock:
                if self._error is None:
                    self._error = e
            raise
        finally:
            self._sem.release()

    def _forget(self, fut: concurrent.futures.Future[Any]) -> None:
        with self._flock:
            self._pending.discard(fut)

    def submit(self, fn: Job) -> None:
        """Queue ``fn`` (blocks while ``max_pending`` writes are outstanding); raises the first
        failure of an earlier write instead of queueing more after it."""
        if self._inline:
            fn()
            return
        with self._flock:
            err = self._error
        if err is not None:
            raise err
        self._sem.acquire()
        try:
            fut = get_io_pool().submit(self._run, fn)
        except BaseException:
            self._sem.release()
            raise
        with self._flock:
            self._pending.add(fut)
        fut.add_done_callback(self._forget)

    def wait(self, *, suppress: bool = False) -> None:
        """Wait for every queued write; re-raise the first error unless ``suppress``."""
        with self._flock:
            futures = list(self._pending)
        concurrent.futures.wait(futures)
        with self._flock:
            err = self._error
        if err is not None and not suppress:
            raise err


def batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    """Yield lists of up to ``n`` items."""
    it = iter(items)
    while True:
        chunk = list(itertools.islice(it, n))
        if not chunk:
            return
        yield chunk


def _drain(pending: deque[concurrent.futures.Future[Any]]) -> None:
    for f in pending:
        f.cancel()
    concurrent.futures.wait(pending)


def run_jobs(jobs: Iterable[Job], *, max_pending: int | None = None) -> None:
    """Run jobs on the pool with at most ``max_pending`` queued; re-raise the first error."""
    workers = num_threads()
    limit = max_pending or 2 * workers
    pending: deque[concurrent.futures.Future[Any]] = deque()
    it = iter(jobs)
    first = list(itertools.islice(it, 2))
    if len(first) < 2 or workers == 1:
        for job in itertools.chain(first, it):
            job()
        return
    pool = get_pool()
    try:
        for job in itertools.chain(first, it):
            pending.append(pool.submit(job))
            while len(pending) > limit:
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    except BaseException:
        _drain(pending)
        raise


Request = tuple[str, "ByteRange | None"]
#: The smallest per-thread fetch buffer :class:`LocalFetcher` allocates.
_MIN_FETCH_BUFFER = 64 << 10



def fetch_batch(store: KvStore) -> int:
    """Keys per fetch for ``store``: 1 for local disk / memory, more for remote stores.

    Local reads cost CPU, not latency, so each worker fetches its own chunk; remote stores
    get several keys per concurrent :meth:`KvStore.get_many` to hide latency.
    """
    env = os.environ.get("ZARR3_FETCH_BATCH")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    return 4 if store.is_remote else 1


class LocalFetcher:
    """Reads whole values of a plain local-directory store into a reused per-thread buffer.

    Used for one-key fetches when the store is (a prefix view of) an
    :class:`~ocdbt_py.kvstore.LocalStore`: it reads the same file ``LocalStore.get`` would,
    but without allocating (and page-faulting) a new buffer for every chunk.  The returned
    view is only valid until the same thread fetches again, which the pipeline guarantees
    (a task decodes what it fetched before fetching more).
    """

    def __init__(self, root: str, prefix: str, max_bytes: int, anchor: str | None = None):
        self.root = root
        self.prefix = prefix
        self.max_bytes = max_bytes
        self._local = threading.local()
        #: the store's no-follow root: files are opened below it with no symbolic link followed
        self.anchor = anchor
        rel = os.path.relpath(root, anchor) if anchor is not None else ""
        self._anchor_prefix = "" if rel in (".", "") else rel.replace(os.sep, "/") + "/"

    @classmethod
    def for_store(cls, store: KvStore, max_bytes: int) -> LocalFetcher | None:
        """A fetcher for ``store`` if it is a local directory, else ``None``."""
        root = store.local_path()
        if root is None or os.environ.get("ZARR3_NO_LOCAL_FETCH"):
            return None
        anchor = store.no_follow_root()
        if anchor is not None and os.path.relpath(root, anchor).startswith(os.pardir):
            anchor = None  # cannot happen for a local store; then open as before
        return cls(root, "", max_bytes, anchor)

    def __call__(self, key: str, byte_range: ByteRange | None) -> Any:

        full = validate_key(self.prefix + key)
        try:
            if self.anchor is not None:
                fd = open_beneath(self.anchor, self._anchor_prefix + full, validated=True)
            else:
                fd = os.open(os.path.join(self.root, *full.split("/")), os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            size = st.st_size
            start, stop = 0, size
            if byte_range is not None:
                start, stop_r = byte_range
                if start < 0:
                    start = max(size + start, 0)
                stop = size if stop_r is None else min(stop_r, size)
            n = max(0, stop - start)
            if n > self.max_bytes:
                return os.pread(fd, n, start)
            buf = getattr(self._local, "buf", None)
            if buf is None or len(buf) < n:
                # sized from the bytes stored (fstat), never from the chunk size the metadata
                # declares: a 20-byte file under a 1 GiB chunk costs kilobytes.  Grows by
                # doubling (at most to max_bytes), so mixed sizes reallocate a few times only.
                grown = max(n, _MIN_FETCH_BUFFER, 2 * len(buf) if buf is not None else 0)
                buf = self._local.buf = memoryview(bytearray(max(n, min(grown, self.max_bytes))))
            view = buf[:n]
            got = 0
            while got < n:
                k = os.preadv(fd, [view[got:]], start + got)
                if k <= 0:
                    break
                got += k
            return view[:got]
        finally:
            os.close(fd)


def run_pipeline(
    store: KvStore,
    units: Iterable[T],
    request: Callable[[T], Request],
    handle: Callable[[T, bytes | None], Sequence[Job]],
    *,
    batch: int | None = None,
    max_pending: int | None = None,
    fetch_one: Callable[[str, ByteRange | None], Any] | None = None,
) -> None:
    """Fetch ``request(unit)`` for every unit and run the jobs ``handle`` returns for it.

    Units are grouped into batches; each batch is one task on the worker pool that fetches
    its keys with one concurrent :meth:`KvStore.get_many` and then runs ``handle(unit, data)``
    and the decode jobs it returns.  Fetched bytes live only inside a running task, so at most
    ``workers * batch`` chunks are held at once; at most ``max_pending`` tasks are queued.
    """
    workers = num_threads()
    k = batch or fetch_batch(store)
    limit = max_pending or 4 * workers

    def task(group: list[T]) -> None:
        if fetch_one is not None and len(group) == 1:
            datas: list[Any] = [fetch_one(*request(group[0]))]
        else:
            datas = store.get_many([request(u) for u in group])
        for i, u in enumerate(group):
            d = datas[i]
            datas[i] = None  # release each chunk as soon as it is decoded
            for job in handle(u, d):
                job()

    groups = batched(units, k)
    head = list(itertools.islice(groups, 2))
    if len(head) < 2 or workers == 1:
        for group in itertools.chain(head, groups):
            task(group)
        return
    pool = get_pool()
    pending: deque[concurrent.futures.Future[Any]] = deque()
    try:
        for group in itertools.chain(head, groups):
            pending.append(pool.submit(task, group))
            while len(pending) > limit:
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    except BaseException:
        _drain(pending)
        raise
