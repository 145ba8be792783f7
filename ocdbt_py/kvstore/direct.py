"""Object-store reads we send ourselves on the threaded HTTP reader, shared by S3, GCS and Azure.

Cloud client libraries (botocore, gcsfs/aiohttp, the Azure SDK) cost start-up time and
per-request Python on the read path of a restore.  Where the configuration is one we fully
understand, a backend's *direct reader* (:mod:`.s3direct`, :mod:`.gcsdirect`,
:mod:`.azuredirect`) makes GET/HEAD/list requests itself on :mod:`.rangeio`'s kept-alive
connections; writes, deletes and anything unusual stay with the client library.
:class:`DirectReadStore` is the store side: it asks the direct reader first and falls back to
the client library for good when the reader raises :class:`Fallback` (a response it does
not expect), or once for a transient network error (the library's client retries).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import http.client
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ocdbt_py import pools
from ocdbt_py.kvstore.futures import all_done
from ocdbt_py.kvstore.object_store import ObjectStore
from ocdbt_py.kvstore.rangeio import HttpRangeReader, HttpStatusError, TlsVerifyError, shared_reader

__all__ = ["Fallback", "DirectReader", "DirectReadStore", "TRANSIENT", "MAX_OBJECT", "off", "proxied",
           "range_headers", "ranged_answer", "reader_for", "ERROR_BODY"]

#: errors after which one read is repeated through the client library (whose client retries)
TRANSIENT = (OSError, http.client.HTTPException)
#: largest object body a direct GET accepts (the caller's ranges bound real reads)
MAX_OBJECT = 1 << 40
#: an error response (a 404's XML or JSON) may be read up to this size whatever range was asked
ERROR_BODY = 1 << 16
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


def reader_for(verify: bool | str | None) -> HttpRangeReader:
    """The shared threaded HTTP reader for a TLS setting, with as many threads (one kept-alive
    connection each) as requests a batch read keeps in flight: ``pools.size("http")``, by default
    ``ObjectStore.max_concurrency`` (``OCDBT_PY_THREADS_HTTP`` or ``OCDBT_PY_HTTP_THREADS`` override it)."""
    return shared_reader(verify, pools.size("http", default=ObjectStore.max_concurrency))


class Fallback(Exception):
    """The direct path cannot answer this read; the client library should (the reason is for
    debugging, and never holds a credential)."""


def off(env: Mapping[str, str], name: str) -> bool:
    """Whether environment variable ``name`` turns a feature off (``0``, ``false``, ``no``)."""
    return env.get(name, "1").strip().lower() in ("0", "false", "no", "off")


def proxied(env: Mapping[str, str]) -> bool:
    """Whether a proxy is configured (our reader does not speak to proxies)."""
    return any(env.get(v) for v in _PROXY_ENV)


def range_headers(start: int, stop: int | None, what: str) -> dict[str, str]:
    """The ``Range`` header of a direct GET of bytes ``[start, stop)`` (none for a whole object)."""
    if start < 0:
        raise Fallback(f"suffix ranges go through {what}")
    if start == 0 and stop is None:
        return {}
    if stop is not None and stop <= start:
        raise Fallback("empty range")
    return {"Range": f"bytes={start}-" + ("" if stop is None else str(stop - 1))}


def ranged_answer(status: int, body: bytes, start: int, stop: int | None) -> bytes | None:
    """What a GET of ``[start, stop)`` answered: the bytes, ``None`` for a missing object,
    ``b""`` for a range past the end; :class:`Fallback` for anything else."""
    if status == 206:
        return body
    if status == 200:
        if start > 0:
            raise Fallback("range ignored")
        return body if stop is None else body[:stop]
    if status == 416:
        return b""
    if status == 404:
        return None
    raise Fallback(f"HTTP {status}")


class DirectReader(Protocol):
    """What a backend's direct reader offers (blocking calls, run on ``reader``'s threads)."""

    reader: HttpRangeReader

    def get(self, bucket: str, name: str, start: int, stop: int | None, *, max_body: int) -> bytes | None:
        """Bytes ``[start, stop)`` (``stop=None``: to the end); ``None`` if absent."""

    def head(self, bucket: str, name: str) -> int | None:
        """The object's size; ``None`` if absent."""

    def list(self, bucket: str, prefix: str) -> builtins.list[tuple[str, int]]:
        """Every ``(name, size)`` below ``prefix``, recursively."""

    def read_into(self, bucket: str, name: str, start: int, buf: memoryview) -> int | None:
        """Read ``len(buf)`` bytes from ``start`` into ``buf``; bytes read, ``None`` if absent."""


class DirectReadStore(ObjectStore):
    """An :class:`ObjectStore` whose reads go through a direct reader in ``_direct`` when it
    has one (``None``: the client library reads everything).  Subclasses ask
    :meth:`_direct_get` / :meth:`_direct_size` first in their ``_get_range`` / ``_object_size``."""

    _direct: DirectReader | None = None

    def _direct_failed(self) -> None:
        """The direct path met something it does not handle: the client library from now on."""
        self._direct = None

    async def _direct_call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a blocking direct-reader call on the HTTP threads, awaited on the event loop."""
        direct = self._direct
        assert direct is not None
        return await asyncio.wrap_future(direct.reader.run(lambda: fn(*args, **kw)))

    async def _direct_get(self, bucket: str, name: str, start: int, stop: int | None) -> tuple[bool, bytes | None]:
        """``(True, value)`` when the direct path answered, ``(False, None)`` to use the library."""
        direct = self._direct
        if direct is None or start < 0:
            return False, None
        try:
            got: bytes | None = await self._direct_call(direct.get, bucket, name, start, stop, max_body=MAX_OBJECT)
            return True, got
        except Fallback:
            self._direct_failed()
        except TRANSIENT:
            pass  # this read again through the library, whose client retries
        return False, None

    async def _direct_size(self, bucket: str, name: str) -> tuple[bool, int | None]:
        """``(True, size)`` when the direct path answered, ``(False, None)`` to use the library."""
        direct = self._direct
        if direct is None:
            return False, None
        try:
            size: int | None = await self._direct_call(direct.head, bucket, name)
            return True, size
        except Fallback:
            self._direct_failed()
        except TRANSIENT:
            pass
        return False, None

    def _find(self, base: str) -> builtins.list[tuple[str, int | None]]:
        direct = self._direct
        if direct is not None:
            bucket, _, name = base.partition("/")
            try:
                found = direct.reader.run(direct.list, bucket, name.rstrip("/") + "/" if name else "").result()
            except Fallback:
                self._direct_failed()
            except TRANSIENT:
                pass  # this listing again through the library, whose client retries
            else:
                return [(f"{bucket}/{k}", size) for k, size in found if not k.endswith("/")]
        return super()._find(base)

    def _start_ahead(self, reqs: Sequence[tuple[str, tuple[int, int]]]
                     ) -> concurrent.futures.Future[builtins.list[Any]]:
        # straight onto the HTTP threads: no hop through the event loop, whose thread may wait
        # for the GIL while the caller parses (the reads of a restore's start are its critical path)
        direct = self._direct
        if direct is None:
            return super()._start_ahead(reqs)
        return all_done([direct.reader.run(self._read_now, k, r) for k, r in reqs])

    def _read_now(self, key: str, rng: tuple[int, int]) -> bytes | None:
        """One read on the calling (HTTP) thread: direct, or through the library if that gave up."""
        direct = self._direct
        bucket, name = self._locate(key)
        if direct is not None:
            try:
                return direct.get(bucket, name, rng[0], rng[1], max_body=MAX_OBJECT)
            except Fallback:
                self._direct_failed()
            except TRANSIENT:
                pass
        return self._run(self._read(key, rng))

    def read_into(self, requests: Sequence[tuple[str, int, memoryview]]
                  ) -> builtins.list[concurrent.futures.Future[int | None]]:
        direct = self._direct
        if direct is None:
            return super().read_into(requests)
        for key, start, _ in requests:
            self._locate(key)
            if start < 0:
                raise ValueError("read_into needs a non-negative start")
        return [direct.reader.run(self._read_into_now, key, start, buf) for key, start, buf in requests]

    def _read_into_now(self, key: str, start: int, buf: memoryview) -> int | None:
        direct = self._direct
        bucket, name = self._locate(key)
        if direct is not None:
            try:
                return direct.read_into(bucket, name, start, buf)
            except (Fallback, HttpStatusError) as e:
                if isinstance(e, HttpStatusError) and e.status not in (0, 200, 301, 307, 400, 401, 403):
                    raise self._fail("reading", key, e) from e
                self._direct_failed()
            except TlsVerifyError as e:
                raise self._fail("reading", key, e) from e
            except TRANSIENT:
                pass  # once more through the library (it retries)
        return self._run(self._read_into_async(key, start, buf))
