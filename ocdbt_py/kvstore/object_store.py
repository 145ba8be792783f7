"""Shared machinery of the object-store backends (S3, GCS, Azure Blob).

An :class:`ObjectStore` is an :class:`~ocdbt_py.kvstore.fsspec_store.FsspecStore` whose
filesystem talks to a bucket service.  Plain reads, listings and writes go through fsspec;
conditional writes go through the service's own client (reached through the filesystem
object), because fsspec has no compare-and-swap.  Subclasses implement two primitives:

* ``_read_with_generation(bucket, name)`` -> ``(bytes, token)`` or ``(None, None)``;
* ``_write_conditional(bucket, name, data, if_generation)`` -> new token, raising
  :class:`ConditionFailedError` when the service refuses the precondition.

Servers that silently ignore preconditions (some S3-compatible stores, the Python GCS
emulator) would let two writers both "win".  So when the endpoint is not the provider's own,
the first conditional write probes the server once: it creates a scratch object twice with
"only if absent", and the second create must be refused.  If it is not, conditional writes
raise :class:`UnsupportedError` unless the store was opened with ``single_writer=True``, in
which case they fall back to read-compare-write, which is only safe with one writer process.

Credentials come only from ``storage_options`` and the services' usual environment variables;
error messages name the URL and never contain a credential (see :func:`redact`).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import os
import re
import threading
import uuid
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar

from ocdbt_py.errors import ConditionFailedError, InvalidKeyError, StorageError, UnsupportedError
from ocdbt_py.kvstore.base import ByteRange, check_range
from ocdbt_py.kvstore.credentials import storage_failure
from ocdbt_py.kvstore.fsspec_store import FsspecStore
from ocdbt_py.kvstore.read_ahead import ReadAhead

__all__ = ["ObjectStore", "redact", "OUR_OPTIONS"]

T = TypeVar("T")

#: storage_options keys that configure ocdbt-py itself and are never passed to fsspec.
OUR_OPTIONS = ("single_writer", "backend")

_SECRET_OPTION = re.compile(
    r"(secret|token|password|passwd|account_key|connection_string|credential|sas|signature|key$)", re.I
)
_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)
_CONN_SECRET = re.compile(r"(AccountKey|SharedAccessSignature|SharedAccessKey)=([^;]+)", re.I)
_URL_SECRET = re.compile(r"([?&](?:sig|X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|access_token)=)[^&\s'\"]+",
                         re.I)


def _secret_strings(options: Any, depth: int = 0) -> Iterable[str]:
    if depth > 4 or not isinstance(options, dict):
        return
    for k, v in options.items():
        if isinstance(v, dict):
            yield from _secret_strings(v, depth + 1)
        elif isinstance(v, str) and isinstance(k, str) and _SECRET_OPTION.search(k):
            yield v
            yield from (m.group(2) for m in _CONN_SECRET.finditer(v))


def redact(text: str, secrets: Iterable[str]) -> str:
    """Remove every secret (and signed-URL parameters, connection-string keys) from ``text``."""
    for s in sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True):
        text = text.replace(s, "<redacted>")
    text = _CONN_SECRET.sub(lambda m: f"{m.group(1)}=<redacted>", text)
    return _URL_SECRET.sub(lambda m: f"{m.group(1)}<redacted>", text)


class ObjectStore(ReadAhead, FsspecStore, abc.ABC):
    """Keys are objects below ``root`` (``bucket/prefix``) of an object-store filesystem.

    ``single_writer=True`` allows non-atomic conditional writes where the server cannot do
    atomic ones; ``custom_endpoint`` says the server is not the provider's own, so conditional
    support is probed once before the first conditional write.
    """

    #: what the service calls its top-level namespace, for messages
    bucket_word = "bucket"

    def __init__(
        self,
        fs: Any,
        root: str,
        *,
        read_only: bool | None = None,
        single_writer: bool = False,
        custom_endpoint: bool = False,
        secrets: Iterable[str] = (),
        scheme: str | None = None,
    ):
        super().__init__(fs, root, read_only=read_only)
        protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self.scheme = scheme or str(protos[0])
        if not self.root:
            raise InvalidKeyError(f"an object-store URL must name a {self.bucket_word}")
        self.single_writer = bool(single_writer)
        self.custom_endpoint = custom_endpoint
        self._secrets = [s for s in secrets if s]
        self._secrets += [os.environ[v] for v in _SECRET_ENV if os.environ.get(v)]
        self._probe_lock = threading.Lock()
        self._conditional_ok: bool | None = None if custom_endpoint else True
        self._emulate_lock = threading.Lock()
        self._init_ahead()

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def _split_options(cls, storage_options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Separate ocdbt-py's own options from fsspec's; listings are never cached."""
        opts = dict(storage_options or {})
        ours = {k: opts.pop(k) for k in OUR_OPTIONS if k in opts}
        opts.setdefault("use_listings_cache", False)
        opts.setdefault("skip_instance_cache", False)
        return opts, ours

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.root}"

    # -- errors ----------------------------------------------------------------------------
    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def _fail(self, what: str, key: str, exc: BaseException) -> StorageError:
        return storage_failure(what, f"{self.url}/{key}", exc, self._redact)

    def _condition_failed(self, key: str, if_generation: str | None) -> ConditionFailedError:
        want = "absent" if if_generation is None else f"at generation {if_generation}"
        return ConditionFailedError(f"conditional write of {self.url}/{key} failed: the object is no longer {want}")

    # -- helpers -----------------------------------------------------------------------------
    def _locate(self, key: str) -> tuple[str, str]:
        path = self._path(key)
        bucket, _, name = path.partition("/")
        if not bucket or not name:
            raise InvalidKeyError(f"{self.url}: key {key!r} names no object")
        return bucket, name

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        # optional: fsspec loads its backends on first use
        from fsspec.asyn import sync

        return sync(self.fs.loop, lambda: coro)  # type: ignore[no-any-return]

    # -- reading: one request per (coalesced) range, all of a batch in flight together ----------
    #: most requests one batch read keeps in flight
    max_concurrency = 64

    @abc.abstractmethod
    async def _get_range(self, bucket: str, name: str, start: int, stop: int | None) -> bytes | None:
        """One GET: bytes ``[start, stop)`` (``stop=None``: to the end; ``start < 0`` with
        ``stop=None``: the last ``-start`` bytes).  ``None`` if the object is absent; a range
        past the end is truncated (``b""`` when it starts past the end)."""

    @abc.abstractmethod
    async def _object_size(self, bucket: str, name: str) -> int | None:
        """One HEAD-like request: the object's size, ``None`` if absent."""

    async def _read(self, key: str, byte_range: ByteRange | None) -> bytes | None:
        bucket, name = self._locate(key)
        if byte_range is None:
            return await self._get_range(bucket, name, 0, None)
        start, stop = byte_range
        if stop is not None and stop <= start:
            return None if await self._object_size(bucket, name) is None else b""
        return await self._get_range(bucket, name, start, stop)

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        self._locate(key)
        check_range(byte_range)
        if self._ahead:
            found, value = self._take_ahead(key, byte_range)
            if found:
                return value
        try:
            return self._run(self._read(key, byte_range))
        except Exception as e:
            raise self._fail("reading", key, e) from e

    def _fetch_concurrently(self, reqs: Sequence[tuple[str, ByteRange | None]]) -> list[bytes | None]:
        for k, r in reqs:
            self._locate(k)
            check_range(r)
        async def one(sem: asyncio.Semaphore, key: str, rng: ByteRange | None) -> bytes | None:
            async with sem:
                try:
                    return await self._read(key, rng)
                except Exception as e:
                    raise self._fail("reading", key, e) from e

        async def run_all() -> list[bytes | None]:
            sem = asyncio.Semaphore(self.max_concurrency)
            return list(await asyncio.gather(*(one(sem, k, r) for k, r in reqs)))

        return self._run(run_all())

    # -- capabilities ------------------------------------------------------------------------
    @property
    def is_remote(self) -> bool:
        return True

    @property
    def lists_sizes(self) -> bool:
        return True

    @property
    def supports_read_into(self) -> bool:
        return True

    # -- values read ahead of their use (checkpoint restore): ReadAhead ------------------------
    def _check_ahead_key(self, key: str) -> None:
        self._locate(key)

    def _start_ahead_read(self, key: str, byte_range: tuple[int, int]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(self._read(key, byte_range), self.fs.loop)

    # -- reading into caller buffers (checkpoint restore) -----------------------------------------
    def read_into(self, requests: Sequence[tuple[str, int, memoryview]]
                  ) -> list[concurrent.futures.Future[int | None]]:
        """Start reading ``len(buf)`` bytes of each ``(key, start, buf)`` from offset ``start``
        into ``buf``; each future gives the bytes read (fewer only when the object ends first)
        or ``None`` when the object is absent, and raises :class:`StorageError` on failure.

        Requests run concurrently and complete in any order, so a caller can decode one while
        others are still arriving; the buffers belong to the caller (and can be reused)."""
        for key, start, _ in requests:
            self._locate(key)
            if start < 0:
                raise ValueError("read_into needs a non-negative start")
        return [self._submit_read_into(key, start, buf) for key, start, buf in requests]

    def _submit_read_into(self, key: str, start: int, buf: memoryview) -> concurrent.futures.Future[int | None]:
        return asyncio.run_coroutine_threadsafe(self._read_into_async(key, start, buf), self.fs.loop)

    async def _read_into_async(self, key: str, start: int, buf: memoryview) -> int | None:
        bucket, name = self._locate(key)
        if len(buf) == 0:
            return 0
        try:
            data = await self._get_range(bucket, name, start, start + len(buf))
        except Exception as e:
            raise self._fail("reading", key, e) from e
        if data is None:
            return None
        n = min(len(data), len(buf))
        buf[:n] = memoryview(data)[:n]
        return n

    def size(self, key: str) -> int | None:
        bucket, name = self._locate(key)
        try:
            return self._run(self._object_size(bucket, name))
        except Exception as e:
            raise self._fail("reading", key, e) from e

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        # object stores have no directories to create: one PUT
        path = self._path(key)
        self._drop_ahead(key)
        self._check_writable()
        try:
            self.fs.pipe_file(path, bytes(value))
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def delete(self, key: str) -> None:
        self._drop_ahead(key)
        super().delete(key)

    # -- conditional writes --------------------------------------------------------------------
    @abc.abstractmethod
    async def _read_with_generation(self, bucket: str, name: str) -> tuple[bytes | None, str | None]:
        """The object's bytes and generation token, ``(None, None)`` if absent."""

    @abc.abstractmethod
    async def _write_conditional(self, bucket: str, name: str, data: bytes, if_generation: str | None) -> str:
        """Write only if the object is at ``if_generation`` (``None``: absent); new token.

        Raises :class:`ConditionFailedError` if the service refuses the precondition and
        :class:`UnsupportedError` if it rejects conditional requests altogether.
        """

    @abc.abstractmethod
    async def _write_plain(self, bucket: str, name: str, data: bytes) -> str:
        """Write unconditionally; returns the new generation token."""

    async def _delete_object(self, bucket: str, name: str) -> None:
        await self.fs._rm_file(f"{bucket}/{name}")

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        bucket, name = self._locate(key)
        try:
            return self._run(self._read_with_generation(bucket, name))
        except (ConditionFailedError, UnsupportedError):
            raise
        except Exception as e:
            raise self._fail("reading", key, e) from e

    def set_if(self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None) -> str:
        bucket, name = self._locate(key)
        self._drop_ahead(key)
        self._check_writable()
        data = bytes(value)
        if not self._conditional_supported():
            return self._emulated_set_if(key, bucket, name, data, if_generation)
        try:
            return self._run(self._write_conditional(bucket, name, data, if_generation))
        except ConditionFailedError as e:
            raise self._condition_failed(key, if_generation) from e
        except UnsupportedError as e:
            if self.single_writer:
                self._conditional_ok = False
                return self._emulated_set_if(key, bucket, name, data, if_generation)
            raise UnsupportedError(self._redact(f"{self.url}: {e}; {self._opt_in_hint()}")) from e
        except Exception as e:
            raise self._fail("writing", key, e) from e

    def _opt_in_hint(self) -> str:
        return (
            "concurrent writers would be unsafe here. If only one process ever writes, open it "
            "with storage_options={'single_writer': True}"
        )

    def _emulated_set_if(self, key: str, bucket: str, name: str, data: bytes, if_generation: str | None) -> str:
        if not self.single_writer:
            raise UnsupportedError(
                f"{self.url} does not enforce conditional writes (its server ignored an "
                f"'only if absent' precondition); {self._opt_in_hint()}"
            )
        with self._emulate_lock:  # atomic within this process only: single-writer mode
            try:
                _, current = self._run(self._read_with_generation(bucket, name))
                if current != if_generation:
                    raise self._condition_failed(key, if_generation)
                return self._run(self._write_plain(bucket, name, data))
            except ConditionFailedError:
                raise
            except Exception as e:
                raise self._fail("writing", key, e) from e

    def _conditional_supported(self) -> bool:
        """Whether the server enforces preconditions (probed once for custom endpoints)."""
        if self._conditional_ok is not None:
            return self._conditional_ok
        with self._probe_lock:
            if self._conditional_ok is None:
                self._conditional_ok = self._probe()
        return self._conditional_ok

    def _probe(self) -> bool:
        probe_key = f".ocdbt-py-precondition-probe-{uuid.uuid4().hex}"
        bucket, name = self._locate(probe_key)

        async def attempt() -> bool:
            await self._write_conditional(bucket, name, b"1", None)
            try:
                await self._write_conditional(bucket, name, b"2", None)
            except ConditionFailedError:
                return True
            return False

        try:
            return self._run(attempt())
        except UnsupportedError:
            return False
        except Exception as e:
            raise self._fail("probing conditional writes at", probe_key, e) from e
        finally:
            try:
                self._run(self._delete_object(bucket, name))
            except Exception:  # noqa: BLE001 - best effort clean-up of the scratch object
                pass
