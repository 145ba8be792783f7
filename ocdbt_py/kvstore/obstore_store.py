"""Object stores (S3, GCS, Azure Blob, HTTP) through obstore, the Python binding of the Rust
``object_store`` crate: it signs and sends every request, pools connections, retries, and
makes the conditional puts that commit an OCDBT database.

:class:`ObstoreStore` is the backend :func:`~ocdbt_py.kvstore.open_kvstore` picks for
``s3://``, ``gs://``, ``az://``/``abfs[s]://`` and ``http(s)://`` URLs when obstore is
installed and the ``storage_options`` are ones it can honour (:mod:`.obstore_options` turns
fsspec's options into obstore's, credentials included; anything it cannot translate keeps the
fsspec route, so no option is silently dropped).

* **Reads.** ``get`` is one GET (a ranged one for a byte range); ``get_many`` merges nearby
  ranges of one object (:func:`~ocdbt_py.kvstore.coalesce.coalesced_get_many`) and keeps up to
  :attr:`ObstoreStore.max_concurrency` requests in flight on one event loop; ``read_into``
  fills caller buffers; ``read_ahead`` starts fetches later reads take over.
* **Writes.** ``set`` is one PUT (obstore switches to a multipart upload past 5 MiB);
  ``set_parts`` and :meth:`ObstoreStore.stream_writer` stream parts as a multipart upload.
* **Commits.** ``get_with_generation`` returns the object's ETag (and version, where the
  service has one) as the token; ``set_if`` is a PUT with ``mode="create"`` (``If-None-Match:
  *``) or ``mode={"e_tag": ..., "version": ...}`` (``If-Match``), refused as
  :class:`ConditionFailedError`.  Against a server that is not the provider's own, the first
  conditional write probes once that a second create-only PUT is refused; a server that
  accepts it gets :class:`UnsupportedError` (or, with ``single_writer=True``, an in-process
  compare-and-swap), as with the fsspec backends.

Untrusted responses: a ranged answer longer than the range asked for is an error, never
returned; listed names that are not valid keys (``..``, empty segments, ...) are skipped, so
no key from a server addresses anything outside the store; error messages are scrubbed of
every credential (:func:`~ocdbt_py.kvstore.object_store.redact`).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import os
import threading
import uuid
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ocdbt_py.errors import (
    ConditionFailedError,
    InvalidKeyError,
    OcdbtError,
    ReadOnlyError,
    StorageError,
    UnsupportedError,
)
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, check_range, normalize_request
from ocdbt_py.kvstore.coalesce import coalesced_get_many
from ocdbt_py.kvstore.credentials import storage_failure
from ocdbt_py.kvstore.keys import validate_key, validate_prefix
from ocdbt_py.kvstore.object_store import redact
from ocdbt_py.kvstore.read_ahead import ReadAhead

__all__ = ["ObstoreStore", "run_on_loop"]

T = TypeVar("T")

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0


def _event_loop() -> asyncio.AbstractEventLoop:
    """The one event loop (on a daemon thread) that awaits every obstore request; a forked
    child, which has no copy of the thread, starts its own."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop.is_closed() or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ocdbt-obstore", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def run_on_loop(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on the obstore event loop; the future gives its result."""
    return asyncio.run_coroutine_threadsafe(coro, _event_loop())


def _token(meta: Any) -> str:
    """The generation token of an object: its ETag, and its version where the service has one."""
    etag = meta.get("e_tag") or ""
    version = meta.get("version")
    return etag if not version else f"{etag}\n{version}"


def _put_mode(if_generation: str | None) -> Any:
    if if_generation is None:
        return "create"
    etag, _, version = if_generation.partition("\n")
    mode: dict[str, str] = {}
    if etag:
        mode["e_tag"] = etag
    if version:
        mode["version"] = version
    return mode


def _buffer(value: bytes | bytearray | memoryview) -> Any:
    """``value`` as obstore takes buffers: 1-D, contiguous, bytes."""
    return value if isinstance(value, bytes) else memoryview(value).cast("B")


class ObstoreStore(ReadAhead, KvStore):
    """Keys are objects of ``store`` (an obstore store already rooted at the bucket and
    prefix this store presents).  Build one with :meth:`from_url`."""

    #: most requests one store keeps in flight
    max_concurrency = 64
    #: :meth:`get_many` merges ranges of one object at most this far apart ...
    coalesce_gap = 1 << 20
    #: ... as long as a merged request stays within this many bytes
    coalesce_max_span = 32 << 20
    #: :meth:`read_into` fetches a larger range as concurrent requests of this many bytes
    part_bytes = 8 << 20
    #: :meth:`read_parts` fetches a range as requests of this many bytes (each request costs
    #: the server: 256 MiB from moto took it 0.15-0.18 CPU-s in 16 MiB requests, 0.23 in 8 MiB,
    #: 0.35-0.39 in 4 MiB) ...
    request_bytes = 16 << 20
    #: ... at most this many in flight (across all its calls), started in the order asked
    #: for: the first range arrives first instead of sharing the link with every other one
    parts_in_flight = 4
    #: :meth:`read_parts` hands each request's body over in pieces of this many bytes, each
    #: as soon as it has arrived
    piece_bytes = 1 << 20
    #: ... made of views of the chunks of at least this many bytes obstore hands over as the
    #: body arrives (cheaper than one request-sized buffer: 256 MiB from moto in 8 MiB
    #: requests took 0.12 s of system time instead of 0.22 s, and no RSS beyond what is held)
    chunk_bytes = 1 << 20

    def __init__(self, store: Any, url: str, *, read_only: bool = False, single_writer: bool = False,
                 custom_endpoint: bool = False, secrets: Iterable[str] = (), lister: Any = None):
        self.store = store
        self._url = url.rstrip("/")
        self.read_only = read_only
        self.single_writer = single_writer
        self._secrets = [s for s in secrets if s]
        #: None: not probed yet (a server that is not the provider's own)
        self._conditional_ok: bool | None = None if custom_endpoint else True
        self._probe_lock = threading.Lock()
        self._emulate_lock = threading.Lock()
        #: a listing of another kind (HTTP servers list by their index pages): a KvStore
        self._lister = lister
        self._sem: asyncio.Semaphore | None = None
        self._parts_sem: asyncio.Semaphore | None = None
        self._no_suffix = False
        self._init_ahead()

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None, *,
                 read_only: bool | None = None) -> ObstoreStore:
        """Open ``url`` through obstore; :class:`UnsupportedError` when its options cannot be
        translated (the caller then takes the fsspec route)."""
        # optional: obstore is an extra, imported only for the URLs it serves
        from ocdbt_py.kvstore.obstore_options import build

        built = build(url, dict(storage_options or {}))
        ro = built.read_only if read_only is None else (read_only or built.read_only)
        return cls(built.store, built.url, read_only=ro, single_writer=built.single_writer,
                   custom_endpoint=built.custom_endpoint, secrets=built.secrets, lister=built.lister)

    @property
    def url(self) -> str:
        return self._url

    # -- plumbing ------------------------------------------------------------------------------
    def _fail(self, what: str, key: str, exc: BaseException) -> StorageError:
        return storage_failure(what, f"{self._url}/{key}", exc, lambda text: redact(text, self._secrets))

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self._url} is read-only")

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_on_loop(coro).result()

    async def _limited(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.max_concurrency)
        async with self._sem:
            return await coro

    @staticmethod
    def _missing(exc: BaseException) -> bool:
        # optional: obstore is an extra
        from obstore.exceptions import NotFoundError

        return isinstance(exc, (NotFoundError, FileNotFoundError))

    # -- reading -----------------------------------------------------------------------------
    async def _head_size(self, key: str) -> int | None:
        # optional: obstore is an extra
        import obstore

        try:
            meta = await obstore.head_async(self.store, key)
        except Exception as e:
            if self._missing(e):
                return None
            raise
        return int(meta["size"])

    async def _cut(self, key: str, rng: ByteRange) -> bytes | None:
        """``rng`` of ``key`` from a whole-object GET (for servers that ignore ``Range``)."""
        # optional: obstore is an extra
        import obstore

        got = await obstore.get_async(self.store, key)
        data = bytes(await got.bytes_async())
        start, stop = rng
        if start < 0:
            return data[max(len(data) + start, 0):]
        return data[start:stop]

    async def _suffix(self, key: str, n: int) -> bytes | None:
        """The last ``n`` bytes (Azure takes no suffix range: its size first, then an offset)."""
        # optional: obstore is an extra
        import obstore
        from obstore.exceptions import NotSupportedError

        if not self._no_suffix:
            try:
                got = await obstore.get_async(self.store, key, options={"range": {"suffix": n}})
                return bytes(await got.bytes_async())
            except NotSupportedError:
                self._no_suffix = True
        size = await self._head_size(key)
        if size is None:
            return None
        got = await obstore.get_async(self.store, key, options={"range": {"offset": max(size - n, 0)}})
        return bytes(await got.bytes_async())

    async def _read(self, key: str, rng: ByteRange | None) -> bytes | None:
        # optional: obstore is an extra
        import obstore

        try:
            if rng is None:
                got = await obstore.get_async(self.store, key)
                return bytes(await got.bytes_async())
            start, stop = rng
            if start < 0:
                return await self._suffix(key, -start)
            if stop is not None and stop <= start:
                return None if await self._head_size(key) is None else b""
            if stop is None:
                got = await obstore.get_async(self.store, key, options={"range": {"offset": start}})
                return bytes(await got.bytes_async())
            data = await obstore.get_range_async(self.store, key, start=start, end=stop)
        except Exception as e:
            if self._missing(e):
                return None
            if rng is not None and ("non-partial" in str(e) or "Range request not supported" in str(e)):
                # the server ignored Range: cut the range out of the whole object
                return await self._cut(key, rng)
            if rng is not None:  # a range of an empty object, or starting at or past the end?
                size = await self._head_size(key)
                if size is None:
                    return None
                if size == 0 or rng[0] >= size:
                    return b""
            raise
        if len(data) > stop - start:
            raise StorageError(f"reading {self._url}/{key}: the server sent {len(data)} bytes for a "
                               f"{stop - start}-byte range")
        return bytes(data)

    def _one(self, key: str, rng: ByteRange | None) -> bytes | None:
        try:
            return self._run(self._limited(self._read(key, rng)))
        except OcdbtError:
            raise
        except Exception as e:
            raise self._fail("reading", key, e) from e

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        validate_key(key)
        check_range(byte_range)
        if self._ahead:
            found, value = self._take_ahead(key, byte_range)
            if found:
                return value
        return self._one(key, byte_range)

    def _fetch(self, reqs: builtins.list[tuple[str, ByteRange | None]]) -> builtins.list[bytes | None]:
        async def one(key: str, rng: ByteRange | None) -> bytes | None:
            try:
                return await self._limited(self._read(key, rng))
            except OcdbtError:
                raise
            except Exception as e:
                raise self._fail("reading", key, e) from e

        async def run_all() -> builtins.list[bytes | None]:
            return builtins.list(await asyncio.gather(*(one(k, r) for k, r in reqs)))

        return self._run(run_all())

    def get_many(self, requests: Sequence[ReadRequest]) -> builtins.list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        for k, r in reqs:
            validate_key(k)
            check_range(r)
        if len(reqs) <= 1:
            return [self.get(k, r) for k, r in reqs]
        return coalesced_get_many(reqs, self._fetch, gap=self.coalesce_gap, max_span=self.coalesce_max_span)

    def size(self, key: str) -> int | None:
        validate_key(key)
        try:
            return self._run(self._head_size(key))
        except Exception as e:
            raise self._fail("reading", key, e) from e

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    # -- listing -----------------------------------------------------------------------------
    def _listed(self, prefix: str) -> builtins.list[tuple[str, int | None]]:
        """Every ``(key, size)`` below the string ``prefix``, sorted by UTF-8 bytes; names that
        are not valid keys are skipped (a server cannot make us address them)."""
        validate_prefix(prefix)
        if self._lister is not None:
            return [(k, None) for k in self._lister.list(prefix)]
        # optional: obstore is an extra
        import obstore

        directory = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        out: builtins.list[tuple[str, int | None]] = []
        try:
            for batch in obstore.list(self.store, directory or None, chunk_size=1000):
                for meta in batch:
                    key = str(meta["path"])
                    if not key.startswith(prefix):
                        continue
                    try:
                        validate_key(key)
                    except InvalidKeyError:
                        continue
                    out.append((key, int(meta["size"])))
        except Exception as e:
            if self._missing(e):
                return []
            raise self._fail("listing", prefix, e) from e
        out.sort(key=lambda kv: kv[0].encode("utf-8", "surrogateescape"))
        return out

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        lo = None if start is None else start.encode("utf-8", "surrogateescape")
        hi = None if stop is None else stop.encode("utf-8", "surrogateescape")
        for key, _ in self._listed(prefix):
            b = key.encode("utf-8", "surrogateescape")
            if (lo is None or b >= lo) and (hi is None or b < hi):
                yield key

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        yield from self._listed(prefix)

    def list_dir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        if self._lister is not None:
            return super().list_dir(prefix)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        validate_prefix(prefix)
        # optional: obstore is an extra
        import obstore

        try:
            got = obstore.list_with_delimiter(self.store, prefix or None)
        except Exception as e:
            if self._missing(e):
                return [], []
            raise self._fail("listing", prefix, e) from e
        dirs, files = [], []
        for p in got["common_prefixes"]:
            name = str(p)[len(prefix):].rstrip("/")
            if name and "/" not in name and name not in (".", ".."):
                dirs.append(name)
        for meta in got["objects"]:
            name = str(meta["path"])[len(prefix):]
            if name and "/" not in name and name not in (".", ".."):
                files.append(name)
        return sorted(dirs), sorted(files)

    # -- writing -----------------------------------------------------------------------------
    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self.set_parts(key, [value])

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        validate_key(key)
        self._check_writable()
        self._drop_ahead(key)
        # optional: obstore is an extra
        import obstore

        bufs = [_buffer(p) for p in parts]
        try:
            if len(bufs) == 1:
                obstore.put(self.store, key, bufs[0])  # multipart past 5 MiB
            else:
                obstore.put(self.store, key, iter(bufs))
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def stream_writer(self, key: str) -> Any:
        validate_key(key)
        self._check_writable()
        self._drop_ahead(key)
        return _StreamSink(self, key)

    def delete(self, key: str) -> None:
        validate_key(key)
        self._check_writable()
        self._drop_ahead(key)
        # optional: obstore is an extra
        import obstore

        try:
            obstore.delete(self.store, key)
        except Exception as e:
            if not self._missing(e):
                raise self._fail("deleting", key, e) from e

    # -- conditional writes --------------------------------------------------------------------
    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        validate_key(key)
        # optional: obstore is an extra
        import obstore

        try:
            got = obstore.get(self.store, key)
            return bytes(got.bytes()), _token(got.meta)
        except Exception as e:
            if self._missing(e):
                return None, None
            raise self._fail("reading", key, e) from e

    def _put_if(self, key: str, data: Any, if_generation: str | None) -> str:
        # optional: obstore is an extra
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        try:
            res = obstore.put(self.store, key, data, mode=_put_mode(if_generation), use_multipart=False)
        except (AlreadyExistsError, PreconditionError) as e:
            raise ConditionFailedError(str(e)) from e
        except NotSupportedError as e:
            raise UnsupportedError(f"conditional puts: {e}") from e
        except Exception as e:
            text = str(e)
            if self._missing(e) and if_generation is not None:  # replaced object deleted since
                raise ConditionFailedError(text) from e
            if "409" in text and "Conflict" in text:  # S3: another conditional write in flight
                raise ConditionFailedError(text) from e
            if "501" in text or "NotImplemented" in text:
                raise UnsupportedError("the server does not implement conditional puts") from e
            raise
        return _token(res)

    def set_if(self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None) -> str:
        validate_key(key)
        self._check_writable()
        self._drop_ahead(key)
        data = bytes(value)
        if not self._conditional_supported():
            return self._emulated_set_if(key, data, if_generation)
        try:
            return self._put_if(key, data, if_generation)
        except ConditionFailedError as e:
            want = "absent" if if_generation is None else f"at generation {if_generation!r}"
            raise ConditionFailedError(f"conditional write of {self._url}/{key} failed: the object is no longer "
                                       f"{want}") from e
        except UnsupportedError as e:
            if self.single_writer:
                self._conditional_ok = False
                return self._emulated_set_if(key, data, if_generation)
            raise UnsupportedError(redact(f"{self._url}: {e}; {_HINT}", self._secrets)) from e
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def _emulated_set_if(self, key: str, data: bytes, if_generation: str | None) -> str:
        if not self.single_writer:
            raise UnsupportedError(f"{self._url} does not enforce conditional writes (its server ignored an "
                                   f"'only if absent' precondition); {_HINT}")
        # optional: obstore is an extra
        import obstore

        with self._emulate_lock:  # atomic within this process only: single-writer mode
            _, current = self.get_with_generation(key)
            if current != if_generation:
                raise ConditionFailedError(f"conditional write of {self._url}/{key} failed")
            try:
                return _token(obstore.put(self.store, key, data))
            except Exception as e:
                raise self._fail("writing", key, e) from e

    def _conditional_supported(self) -> bool:
        if self._conditional_ok is None:
            with self._probe_lock:
                if self._conditional_ok is None:
                    self._conditional_ok = self._probe()
        return self._conditional_ok

    def _probe(self) -> bool:
        """Whether the server refuses a second create-only PUT of one key (once per store)."""
        # optional: obstore is an extra
        import obstore

        key = f".ocdbt-py-precondition-probe-{uuid.uuid4().hex}"
        try:
            self._put_if(key, b"1", None)
            try:
                self._put_if(key, b"2", None)
            except ConditionFailedError:
                return True
            return False
        except UnsupportedError:
            return False
        except Exception as e:
            raise self._fail("probing conditional writes at", key, e) from e
        finally:
            try:
                obstore.delete(self.store, key)
            except Exception:  # noqa: BLE001 - best-effort clean-up of the scratch object
                pass

    # -- capabilities ------------------------------------------------------------------------
    @property
    def supports_conditional_writes(self) -> bool:
        return not self.read_only and self._lister is None

    @property
    def is_remote(self) -> bool:
        return True

    @property
    def lists_sizes(self) -> bool:
        return self._lister is None

    @property
    def renames_atomically(self) -> bool:
        return False

    @property
    def supports_read_into(self) -> bool:
        return True

    def read_into(self, requests: Sequence[tuple[str, int, memoryview]]
                  ) -> builtins.list[concurrent.futures.Future[int | None]]:
        """Start reading ``len(buf)`` bytes of each ``(key, start, buf)`` from ``start`` into
        ``buf``; each future gives the bytes read (fewer only where the object ends first) or
        ``None`` when the object is absent, and raises :class:`StorageError` on failure."""
        for key, start, _ in requests:
            validate_key(key)
            if start < 0:
                raise ValueError("read_into needs a non-negative start")
        return [run_on_loop(self._read_into(k, s, b)) for k, s, b in requests]

    async def _read_into(self, key: str, start: int, buf: memoryview) -> int | None:
        """One range read into ``buf``: a large one as concurrent parts of :attr:`part_bytes`
        (each request in flight counts toward :attr:`max_concurrency`), written straight into
        their slices of ``buf``."""
        n = len(buf)
        if n == 0:
            return 0
        step = self.part_bytes
        parts = [(off, min(off + step, n)) for off in range(0, n, step)]
        got = await asyncio.gather(*(self._limited(self._part_into(key, start, buf, a, b)) for a, b in parts))
        if got[0] is None:
            return None
        total = 0
        for (a, b), m in zip(parts, got):
            total += m or 0
            if m is None or m < b - a:  # the object ended inside this part
                break
        return total

    async def _part_into(self, key: str, start: int, buf: memoryview, a: int, b: int) -> int | None:
        try:
            data = await self._read_raw(key, start + a, start + b)
        except OcdbtError:
            raise
        except Exception as e:
            raise self._fail("reading", key, e) from e
        if data is None:
            return None
        m = len(data)
        buf[a:a + m] = memoryview(data)
        return m

    @property
    def supports_read_parts(self) -> bool:
        return True

    def read_parts(self, key: str, lo: int, hi: int
                   ) -> builtins.list[tuple[int, concurrent.futures.Future[Any]]]:
        """Start reading bytes ``[lo, hi)`` of ``key``: one GET per :attr:`request_bytes`, each
        body handed over in pieces of :attr:`piece_bytes` as it streams in.  Returns
        ``(offset, future)`` per piece in offset order; a future gives the piece as a list of
        buffers (views of what obstore received, not copied), shorter or empty where the
        object ends first, or ``None`` when it is absent, and raises :class:`StorageError` on
        failure.  Requests start in the order asked for, at most :attr:`parts_in_flight` at a
        time (each also counts toward :attr:`max_concurrency`)."""
        validate_key(key)
        if lo < 0 or hi < lo:
            raise ValueError("read_parts needs 0 <= lo <= hi")
        out: builtins.list[tuple[int, concurrent.futures.Future[Any]]] = []
        for a in range(lo, hi, self.request_bytes):
            b = min(a + self.request_bytes, hi)
            pieces: builtins.list[tuple[int, concurrent.futures.Future[Any]]] = [
                (p, concurrent.futures.Future()) for p in range(a, b, self.piece_bytes)]
            out += pieces
            run_on_loop(self._ordered_request(key, a, b, pieces))
        return out

    async def _ordered_request(self, key: str, lo: int, hi: int,
                               pieces: builtins.list[tuple[int, concurrent.futures.Future[Any]]]) -> None:
        if self._parts_sem is None:
            self._parts_sem = asyncio.Semaphore(self.parts_in_flight)
        try:
            async with self._parts_sem:
                await self._limited(self._stream_pieces(key, lo, hi, pieces))
        except BaseException as e:  # noqa: BLE001 - handed to every piece not yet answered
            err = e if isinstance(e, OcdbtError) or not isinstance(e, Exception) else self._fail("reading", key, e)
            for _, f in pieces:
                if not f.done():
                    f.set_exception(err)
            if not isinstance(e, Exception):
                raise

    async def _stream_pieces(self, key: str, lo: int, hi: int,
                             pieces: builtins.list[tuple[int, concurrent.futures.Future[Any]]]) -> None:
        """Answer each of ``pieces`` (consecutive, from ``lo`` to ``hi``) as soon as the body
        holds it: views of the chunks (of at least :attr:`chunk_bytes`) obstore hands over."""
        # optional: obstore is an extra
        import obstore

        try:
            got = await obstore.get_async(self.store, key, options={"range": (lo, hi)})
        except Exception:
            data = await self._read_raw(key, lo, hi)  # past the end, absent, ignored Range...
            chunks = None if data is None else [data]
            k = 0
        else:
            chunks = []
            n = k = 0
            async for c in got.stream(min_chunk_size=self.chunk_bytes):
                n += len(c)
                if n > hi - lo:
                    raise StorageError(f"reading {self._url}/{key}: the server sent more than the {hi - lo} "
                                       f"bytes of the range")
                chunks.append(c)
                while k < len(pieces) and _stop(pieces, k, hi) <= lo + n:
                    chunks = _answer(pieces[k], _stop(pieces, k, hi), chunks)
                    k += 1
        for j in range(k, len(pieces)):  # the body ended first, or came in one piece
            if chunks is None:
                pieces[j][1].set_result(None)
            else:
                chunks = _answer(pieces[j], _stop(pieces, j, hi), chunks)

    async def _read_raw(self, key: str, lo: int, hi: int) -> Any:
        """Bytes ``[lo, hi)`` as obstore returns them (no copy), ``b""`` past the end, ``None``
        when absent; longer than asked is an error."""
        # optional: obstore is an extra
        import obstore

        try:
            data: Any = await obstore.get_range_async(self.store, key, start=lo, end=hi)
        except Exception:
            data = await self._read(key, (lo, hi))  # past the end, absent, ignored Range...
            return data
        if len(data) > hi - lo:
            raise StorageError(f"reading {self._url}/{key}: the server sent {len(data)} bytes for a "
                               f"{hi - lo}-byte range")
        return data

    # -- values read ahead of their use (checkpoint restore): ReadAhead ------------------------
    def _check_ahead_key(self, key: str) -> None:
        validate_key(key)

    def _start_ahead_read(self, key: str, byte_range: tuple[int, int]) -> concurrent.futures.Future[Any]:
        return run_on_loop(self._limited(self._read(key, byte_range)))

    def close(self) -> None:
        """Nothing to release: connections belong to obstore's pool."""


def _stop(pieces: Sequence[tuple[int, Any]], k: int, hi: int) -> int:
    """Where piece ``k`` ends: where the next starts, the last at ``hi``."""
    return pieces[k + 1][0] if k + 1 < len(pieces) else hi


def _answer(piece: tuple[int, concurrent.futures.Future[Any]], stop: int, chunks: builtins.list[Any]
            ) -> builtins.list[Any]:
    """Answer ``piece`` (which starts where ``chunks`` start) with views of ``chunks`` up to
    ``stop`` (all of them, if they end first); return what is left for the next piece."""
    start, fut = piece
    want = max(0, stop - start)
    got: builtins.list[memoryview] = []
    rest: builtins.list[Any] = []
    for c in chunks:
        mv = memoryview(c)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if want >= len(mv):
            got.append(mv)
            want -= len(mv)
        elif want > 0:
            got.append(mv[:want])
            rest.append(mv[want:])
            want = 0
        else:
            rest.append(mv)
    fut.set_result(got)
    return rest


_HINT = ("concurrent writers would be unsafe here. If only one process ever writes, open it with "
         "storage_options={'single_writer': True}")


class _StreamSink:
    """A multipart upload fed as the value is produced (obstore's buffered writer): nothing
    is visible at the key until :meth:`close` completes the upload."""

    def __init__(self, owner: ObstoreStore, key: str):
        # optional: obstore is an extra
        import obstore

        self.owner = owner
        self.key = key
        try:
            self._w: Any = obstore.open_writer(owner.store, key)
        except Exception as e:
            raise owner._fail("writing", key, e) from e

    def write(self, data: bytes | memoryview) -> int:
        n = memoryview(data).nbytes
        try:
            self._w.write(_buffer(data))
        except Exception as e:
            raise self.owner._fail("writing", self.key, e) from e
        return n

    def close(self) -> None:
        try:
            self._w.close()
        except Exception as e:
            raise self.owner._fail("writing", self.key, e) from e

    def abort(self) -> None:
        """Give up: the upload is never completed, so nothing appears at the key."""
        self._w = None
