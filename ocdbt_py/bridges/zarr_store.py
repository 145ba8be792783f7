"""A zarr-python 3 store over an OCDBT database: :class:`OcdbtZarrStore`.

zarr-python (optional extra ``[zarr]``) opens arrays and groups in any OCDBT database
through it, at any URL ``ocdbt_py.open`` takes::

    store = OcdbtZarrStore("s3://bucket/db", storage_options={...})
    z = zarr.create_array(store, name="a", shape=(1000,), chunks=(100,), dtype="f4")
    zarr.open_array(OcdbtZarrStore("/ckpt/1000/params", read_only=True), path="w")

* **Reads** see the version current when the store first touched the database, plus this
  store's own commits; :meth:`OcdbtZarrStore.refresh` (and reopening, e.g. unpickling in a dask
  worker) moves to the latest.  ``version=`` (a generation number or an ISO-8601 time) reads
  an older commit and makes the store read-only.  Byte-range requests (``RangeByteRequest``,
  ``OffsetByteRequest``, ``SuffixByteRequest``) read only the bytes asked for;
  ``get_partial_values`` is one B+tree traversal and one batch of coalesced reads, and so are
  the ``get`` calls made in one turn of the event loop (zarr-python starts a batch of chunk
  reads together): they go to one thread as one ``get_many``.
* **Writes** are commits.  Writes that arrive while a commit is running (zarr-python writes
  chunks concurrently) are grouped into the next commit, so a burst of ``set`` calls makes a few
  generations, not one per chunk; ``_set_many`` and ``delete_dir`` are one commit each.  A
  ``set`` returns once its commit is durable.
* An empty directory (or a location with nothing yet) is an empty database: reads find no key,
  the first write creates the database.
* The blocking work (every read, listing and commit) runs on threads, never on the event loop.

The wrapped ``ocdbt_py`` handle is :attr:`OcdbtZarrStore.db` (``get``, ``transaction()``, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, TypeVar

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

import ocdbt_py
from ocdbt_py import pools
from ocdbt_py.errors import NotFoundError
from ocdbt_py.store import OcdbtStore, Version

__all__ = ["OcdbtZarrStore"]

T = TypeVar("T")

#: Keys handed from a listing thread to the event loop at a time.
_LIST_BATCH = 1024

_Range = tuple[int, int | None]


def _to_range(byte_range: ByteRequest | None) -> _Range | None:
    """zarr-python's byte request as ocdbt-py's ``(start, stop)`` (negative start: a suffix)."""
    if byte_range is None:
        return None
    if isinstance(byte_range, RangeByteRequest):
        if byte_range.start < 0 or byte_range.end < byte_range.start:
            raise ValueError(f"Unexpected byte_range, got {byte_range}")
        return (byte_range.start, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        if byte_range.offset < 0:
            raise ValueError(f"Unexpected byte_range, got {byte_range}")
        return (byte_range.offset, None)
    if isinstance(byte_range, SuffixByteRequest):
        if byte_range.suffix < 0:
            raise ValueError(f"Unexpected byte_range, got {byte_range}")
        return None if byte_range.suffix == 0 else (-byte_range.suffix, None)
    raise TypeError(f"Unexpected byte_range, got {byte_range}")


def _suffix_zero(byte_range: ByteRequest | None) -> bool:
    return isinstance(byte_range, SuffixByteRequest) and byte_range.suffix == 0


def _enc(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def _dec(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def _after_prefix(prefix: bytes) -> bytes | None:
    """The first key after every key starting with ``prefix`` (``None``: no such key)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


async def _run(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread (the event loop is never blocked by I/O)."""
    return await asyncio.to_thread(fn, *args)


class _GroupCommit:
    """Commits writes in groups: the writes that arrive while a commit runs go into the next.

    ``submit`` returns a future that completes when the write's commit is durable (with the
    generation) or failed (with its error, for every write of the group).
    """

    def __init__(self, db: OcdbtStore):
        self._db = db
        self._lock = threading.Lock()
        self._queue: list[tuple[Callable[[Any], None], concurrent.futures.Future[int]]] = []
        self._running = False

    def submit(self, op: Callable[[Any], None], *, inline: bool = False) -> concurrent.futures.Future[int]:
        """Queue ``op(transaction)`` for the next commit.  When no commit is running, one
        starts: on the calling thread with ``inline`` (a blocking caller: the future is done on
        return, and no pool thread is waited for), else on the ``io`` pool."""
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            self._queue.append((op, fut))
            if self._running:
                return fut
            self._running = True
        if inline:
            self._drain()
            return fut
        try:
            pools.shared("io").submit(self._drain)
        except BaseException:
            with self._lock:
                self._running = False
            raise
        return fut

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._running = False
                    return
            try:
                txn = self._db.transaction()
                for op, _ in batch:
                    op(txn)
                gen = txn.commit()
            except BaseException as e:  # every write of the group learns why
                for _, fut in batch:
                    fut.set_exception(e)
            else:
                for _, fut in batch:
                    fut.set_result(gen)


class OcdbtZarrStore(Store):
    """A ``zarr.abc.store.Store`` over the OCDBT database at ``url`` (path or fsspec URL).

    ``read_only``: refuse writes; ``storage_options``: the fsspec filesystem's options;
    ``version``: read an older commit (generation number, ISO-8601 time or ``datetime``;
    read-only).  Equal to every store over the same location, mode and version; picklable.
    """

    supports_writes: bool = True
    supports_deletes: bool = True
    supports_listing: bool = True

    def __init__(
        self,
        url: str,
        read_only: bool = False,
        storage_options: dict[str, Any] | None = None,
        *,
        version: Version | None = None,
    ) -> None:
        if version is not None and not read_only:
            read_only = True  # an older commit cannot be written to
        super().__init__(read_only=read_only)
        self.url = str(url)
        self.storage_options = dict(storage_options) if storage_options else None
        self.version = version
        self._db: OcdbtStore | None = None
        self._empty = False
        self._open_lock = threading.Lock()
        self._committer: _GroupCommit | None = None
        #: ``get`` calls waiting for the end of their event-loop turn, per loop (see _flush_reads)
        self._pending: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        self._batches: set[asyncio.Task[None]] = set()  # running batches (kept referenced)

    # -- identity ----------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, OcdbtZarrStore)
            and self.url == other.url
            and self.read_only == other.read_only
            and self.version == other.version
            and self.storage_options == other.storage_options
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.url, self.read_only, str(self.version)))

    def __repr__(self) -> str:
        at = "" if self.version is None else f", version={self.version!r}"
        return f"OcdbtZarrStore({self.url!r}, read_only={self.read_only}{at})"

    def __str__(self) -> str:
        return f"ocdbt+{self.url}"

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "read_only": self.read_only, "storage_options": self.storage_options,
                "version": self.version, "is_open": self._is_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["read_only"], state["storage_options"],  # type: ignore[misc]
                      version=state["version"])
        self._is_open = state["is_open"]

    def with_read_only(self, read_only: bool = False) -> OcdbtZarrStore:
        """A new (unopened) store over the same location with the given ``read_only``."""
        if not read_only and self.version is not None:
            raise ValueError("a store opened at a version= is read-only")
        return type(self)(self.url, read_only=read_only, storage_options=self.storage_options,
                          version=self.version)

    # -- the database ------------------------------------------------------------------------
    def _handle(self) -> OcdbtStore | None:
        """The database, opened on first use (``None``: read-only and nothing there yet)."""
        db = self._db
        if db is not None or self._empty:
            return db
        with self._open_lock:
            if self._db is None and not self._empty:
                mode = "r" if self.read_only else "a"
                try:
                    self._db = ocdbt_py.open(self.url, version=self.version, mode=mode,
                                             storage_options=self.storage_options)
                except NotFoundError:
                    if self.version is not None:
                        raise
                    self._empty = True  # an empty location is an empty database
            return self._db

    @property
    def db(self) -> OcdbtStore:
        """The ``ocdbt_py`` database this store wraps (``get``, ``transaction()``, ``versions()``)."""
        db = self._handle()
        if db is None:
            raise NotFoundError(f"no OCDBT database at {self.url} yet (the store is read-only)")
        return db

    def refresh(self) -> None:
        """See the commits made since the store was opened (by other stores or processes)."""
        if self._empty:
            with self._open_lock:
                self._empty = False
        db = self._handle()
        if db is not None and self.version is None:
            db.refresh()

    async def _open(self) -> None:
        await super()._open()
        if not self.read_only:
            await _run(self._handle)

    def close(self) -> None:
        """Close the store (the database's caches are released; a later use reopens it)."""
        super().close()
        with self._open_lock:
            db, self._db, self._committer, self._empty = self._db, None, None, False
        if db is not None:
            db.close()

    # -- reading -----------------------------------------------------------------------------
    def _read(self, key: str, rng: _Range | None) -> bytes | None:
        db = self._handle()
        return None if db is None else db.get(_enc(key), rng)

    def _read_many(self, reqs: list[tuple[str, _Range | None]]) -> list[bytes | None]:
        db = self._handle()
        if db is None:
            return [None] * len(reqs)
        return db.get_many([(_enc(k), r) for k, r in reqs])

    @staticmethod
    def _buffer(prototype: BufferPrototype | None, data: bytes | None, empty: bool) -> Buffer | None:
        if data is None:
            return None
        proto = prototype or default_buffer_prototype()
        return proto.buffer.from_bytes(b"" if empty else data)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """The value of ``key`` (or the bytes ``byte_range`` asks for), ``None`` if absent."""
        if not self._is_open:
            await self._open()
        rng = _to_range(byte_range)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes | None] = loop.create_future()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._flush_reads, loop)
        pending.append((key, rng, fut))
        data = await fut
        return self._buffer(prototype, data, _suffix_zero(byte_range))

    def _flush_reads(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the ``get`` calls made in one turn of the event loop (zarr-python starts a
        chunk's reads together) to one thread as one ``get_many``: one B+tree traversal, one
        batch of coalesced reads, one thread hop instead of one per chunk."""
        batch = self._pending.pop(loop, [])
        if batch:
            self._batches.add(loop.create_task(self._read_batch(batch)))

    async def _read_batch(self, batch: list[tuple[str, _Range | None, asyncio.Future[bytes | None]]]) -> None:
        try:
            if len(batch) == 1:
                datas = [await _run(self._read, batch[0][0], batch[0][1])]
            else:
                datas = await _run(self._read_many, [(k, r) for k, r, _ in batch])
        except BaseException as e:  # every read of the batch learns why
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
        else:
            for (_, _, fut), d in zip(batch, datas):
                if not fut.done():
                    fut.set_result(d)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._batches.discard(task)

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """:meth:`get` without an event loop."""
        data = self._read(key, _to_range(byte_range))
        return self._buffer(prototype, data, _suffix_zero(byte_range))

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """Many (possibly partial) values in one traversal and one batch of coalesced reads."""
        pairs = list(key_ranges)
        if not pairs:
            return []
        reqs = [(k, _to_range(r)) for k, r in pairs]
        datas = await _run(self._read_many, reqs)
        return [self._buffer(prototype, d, _suffix_zero(r)) for d, (_, r) in zip(datas, pairs)]

    async def exists(self, key: str) -> bool:
        """Whether ``key`` is in the database."""
        def has() -> bool:
            db = self._handle()
            return db is not None and _enc(key) in db
        return await _run(has)

    def _size(self, key: str) -> int | None:
        db = self._handle()
        if db is None:
            return None
        k = _enc(key)
        for e in db.entries(k, k):
            return e.size if e.key == k else None
        return None

    async def getsize(self, key: str) -> int:
        """The size of the value at ``key`` from the B+tree leaf (no value is read)."""
        size = await _run(self._size, key)
        if size is None:
            raise FileNotFoundError(key)
        return size

    async def getsize_prefix(self, prefix: str) -> int:
        """The total size of the values below ``prefix`` (sizes from the leaves, no value read)."""
        if prefix and not prefix.endswith("/"):
            prefix += "/"

        def total() -> int:
            db = self._handle()
            if db is None:
                return 0
            return sum(sum(c.sizes) for c in db.entry_columns(_enc(prefix)))
        return await _run(total)

    # -- writing -----------------------------------------------------------------------------
    def _writes(self) -> _GroupCommit:
        c = self._committer
        if c is None:
            db = self.db
            with self._open_lock:
                if self._committer is None:
                    self._committer = _GroupCommit(db)
                c = self._committer
        return c

    def _submit(self, op: Callable[[Any], None], *, inline: bool = False) -> concurrent.futures.Future[int]:
        self._check_writable()
        return self._writes().submit(op, inline=inline)

    async def set(self, key: str, value: Buffer) -> None:
        """Set ``key`` to ``value`` (committed, durable, when this returns)."""
        self._check_writable()
        if not self._is_open:
            await self._open()
        if not isinstance(value, Buffer):
            raise TypeError(f"OcdbtZarrStore.set(): `value` must be a Buffer instance. Got {type(value)}")
        data = value.to_bytes()
        k = _enc(key)
        await asyncio.wrap_future(self._submit(lambda t: t.put(k, data)))

    def set_sync(self, key: str, value: Buffer) -> None:
        """:meth:`set` without an event loop."""
        data = value.to_bytes()
        k = _enc(key)
        self._submit(lambda t: t.put(k, data), inline=True).result()

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        """Set ``key`` unless it exists, atomically (a conditional commit)."""
        self._check_writable()
        data = value.to_bytes()
        k = _enc(key)

        def put_absent() -> None:
            txn = self.db.transaction()
            if txn.get(k) is None:
                txn.put(k, data, if_equal=None)
                try:
                    txn.commit()
                except ocdbt_py.ConditionFailedError:
                    pass  # another writer set it first: it exists
        await _run(put_absent)

    async def _set_many(self, values: Iterable[tuple[str, Buffer]]) -> None:
        """Set many keys in one commit."""
        self._check_writable()
        items = [(_enc(k), v.to_bytes()) for k, v in values]

        def put_all(t: Any) -> None:
            for k, d in items:
                t.put(k, d)
        await asyncio.wrap_future(self._submit(put_all))

    async def delete(self, key: str) -> None:
        """Delete ``key`` (an absent key is no error)."""
        self._check_writable()
        k = _enc(key)
        await asyncio.wrap_future(self._submit(lambda t: t.delete(k)))

    def delete_sync(self, key: str) -> None:
        """:meth:`delete` without an event loop."""
        k = _enc(key)
        self._submit(lambda t: t.delete(k), inline=True).result()

    async def delete_dir(self, prefix: str) -> None:
        """Delete every key below ``prefix`` in one commit (a range deletion)."""
        self._check_writable()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        lo = _enc(prefix)
        hi = _after_prefix(lo)
        await asyncio.wrap_future(self._submit(lambda t: t.delete_range(lo, hi)))

    # -- listing -----------------------------------------------------------------------------
    async def _iterate(self, make: Callable[[], Iterator[str]]) -> AsyncIterator[str]:
        it: Iterator[str] | None = None

        def batch() -> list[str]:
            nonlocal it
            if it is None:
                it = make()
            out: list[str] = []
            for k in it:
                out.append(k)
                if len(out) >= _LIST_BATCH:
                    break
            return out
        while True:
            keys = await _run(batch)
            for k in keys:
                yield k
            if len(keys) < _LIST_BATCH:
                return

    def _keys(self, prefix: str) -> Iterator[str]:
        db = self._handle()
        if db is None:
            return
        for k in db.list(_enc(prefix)):
            yield _dec(k)

    def _children(self, prefix: str) -> Iterator[str]:
        """Names directly below ``prefix`` (ending in ``/`` or empty): each subdirectory is
        skipped over with one B+tree descent."""
        db = self._handle()
        if db is None:
            return
        p = _enc(prefix)
        start: bytes | None = None
        while True:
            restart = None
            for k in db.list(p, start):
                rest = k[len(p):]
                slash = rest.find(b"/")
                if slash >= 0:
                    d = rest[:slash]
                    yield _dec(d)
                    restart = p + d + b"0"  # past every key under d/: "0" follows "/"
                    break
                yield _dec(rest)
            if restart is None:
                return
            start = restart

    def list(self) -> AsyncIterator[str]:
        """Every key, in byte order."""
        return self._iterate(lambda: self._keys(""))

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every key starting with ``prefix`` (full keys), in byte order."""
        return self._iterate(lambda: self._keys(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The keys and subdirectory names directly below ``prefix``."""
        p = prefix.rstrip("/")
        p = p + "/" if p else ""
        return self._iterate(lambda: self._children(p))
