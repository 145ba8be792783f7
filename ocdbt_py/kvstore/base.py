"""The one storage interface every layer of ocdbt-py talks to.

A :class:`KvStore` maps ``str`` keys (``/``-separated relative paths, validated by
:func:`ocdbt_py.kvstore.keys.validate_key`) to immutable byte strings.  Backends implement a
handful of primitives; everything else (concurrent batch reads, existence checks) has a
default built on them.
"""

from __future__ import annotations

import abc
import builtins
import concurrent.futures
from collections.abc import Iterator, Sequence
from typing import Any, Union

from ocdbt_py.errors import ReadOnlyError, UnsupportedError
from ocdbt_py.pools import map_concurrently

__all__ = ["KvStore", "ByteRange", "ReadRequest", "normalize_request", "slice_range"]

#: A byte range ``(start, stop)``.  ``stop=None`` reads to the end; a negative ``start`` with
#: ``stop=None`` reads that many bytes from the end (a suffix).
ByteRange = tuple[int, Union[int, None]]

#: One entry of a batch read: a key, or a key and a byte range.
ReadRequest = Union[str, tuple[str, Union[ByteRange, None]]]

_DEFAULT_WORKERS = 16


def normalize_request(req: ReadRequest) -> tuple[str, ByteRange | None]:
    """Turn a :data:`ReadRequest` into ``(key, byte_range)``."""
    if isinstance(req, str):
        return req, None
    key, rng = req
    return key, rng


def check_range(rng: ByteRange | None) -> None:
    """Raise ``ValueError`` for a malformed byte range."""
    if rng is None:
        return
    start, stop = rng
    if not isinstance(start, int) or (stop is not None and not isinstance(stop, int)):
        raise TypeError(f"byte range must hold ints, got {rng!r}")
    if start < 0:
        if stop is not None:
            raise ValueError(f"a suffix range takes stop=None, got {rng!r}")
    elif stop is not None and stop < start:
        raise ValueError(f"byte range stop < start: {rng!r}")


def slice_range(data: bytes, rng: ByteRange | None) -> bytes:
    """Apply a byte range to an in-memory value (short results at the end, like files)."""
    if rng is None:
        return data
    start, stop = rng
    if start < 0:
        return data[max(len(data) + start, 0):]
    return data[start:stop]


class KvStore(abc.ABC):
    """Abstract key-value store: the only way ocdbt-py touches storage.

    Subclasses implement :meth:`get`, :meth:`list` and, when writable, :meth:`set` and
    :meth:`delete`.  Conditional writes (:meth:`get_with_generation` / :meth:`set_if`) are
    optional: backends that cannot make them atomic raise :class:`UnsupportedError`.

    **Capabilities.**  What a backend can do beyond the primitives is declared by the members
    of the *capabilities* section below, each with a default that is always correct (no fast
    path).  Layers above ``kvstore/`` ask these and never test concrete store types.  A
    wrapper forwards a capability when using it does not bypass the wrapper:
    :class:`~ocdbt_py.kvstore.prefixed.PrefixStore` forwards all of them; a latency or
    fault-injecting store forwards only those that do not read or write around it.
    """

    #: Whether writes are allowed on this store.
    read_only: bool = False

    @property
    def url(self) -> str:
        """A human-readable location for error messages (never contains credentials)."""
        return f"<{type(self).__name__}>"

    # -- reading -------------------------------------------------------------------------
    @abc.abstractmethod
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        """Return the value (or the byte range of it) stored at ``key``, or ``None`` if absent.

        A range past the end of the value is truncated, as with files.
        """

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        """Read many keys or ranges concurrently; results are in request order."""
        reqs = [normalize_request(r) for r in requests]
        if len(reqs) <= 1:
            return [self.get(k, r) for k, r in reqs]
        return map_concurrently(lambda kr: self.get(kr[0], kr[1]), reqs, purpose="io", limit=_DEFAULT_WORKERS)

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds a value."""
        return self.get(key, (0, 0)) is not None

    def size(self, key: str) -> int | None:
        """The length in bytes of the value at ``key``, or ``None`` if absent.

        The default reads the whole value; backends that can ask for the size alone override it.
        """
        data = self.get(key)
        return None if data is None else len(data)

    @abc.abstractmethod
    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        """Yield the keys that start with ``prefix`` and lie in ``[start, stop)``, sorted.

        Keys are compared as UTF-8 bytes, so the order matches OCDBT's.
        """

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        """:meth:`list` with each key's size where the listing gives it for free (object
        stores), else ``None``; never a request per key."""
        for key in self.list(prefix):
            yield key, None

    def list_dir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        """Return ``(subdirectories, keys)`` directly below ``prefix`` (a ``/``-terminated path).

        The default walks :meth:`list`; backends with a cheaper directory listing override it.
        """
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        dirs: set[str] = set()
        files: list[str] = []
        for key in self.list(prefix):
            rest = key[len(prefix):]
            if "/" in rest:
                dirs.add(rest.split("/", 1)[0])
            else:
                files.append(rest)
        return sorted(dirs), files

    # -- writing -------------------------------------------------------------------------
    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        """Store ``value`` at ``key``, replacing any previous value."""
        raise ReadOnlyError(f"{self.url} is read-only")

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Store the concatenation of ``parts`` at ``key``.

        Backends that can stream override this so large values are never joined in memory.
        """
        self.set(key, parts[0] if len(parts) == 1 else b"".join(parts))

    def delete(self, key: str) -> None:
        """Remove ``key``; removing an absent key is not an error."""
        raise ReadOnlyError(f"{self.url} is read-only")

    def delete_prefix(self, prefix: str) -> None:
        """Remove every key below ``prefix``."""
        for key in list(self.list(prefix)):
            self.delete(key)

    # -- conditional writes -------------------------------------------------------------
    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        """Return ``(value, generation)``; ``(None, None)`` when absent.

        The generation is an opaque token that changes whenever the key is rewritten.
        """
        raise UnsupportedError(f"{self.url} does not support conditional writes")

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        """Atomically write ``value`` only if ``key`` is still at ``if_generation``.

        ``if_generation=None`` means "only if absent".  Returns the new generation; raises
        :class:`~ocdbt_py.errors.ConditionFailedError` if the condition does not hold and
        :class:`~ocdbt_py.errors.UnsupportedError` if the backend cannot do this atomically.
        """
        raise UnsupportedError(f"{self.url} does not support conditional writes")

    # -- capabilities ----------------------------------------------------------------------
    def local_path(self, key: str = "") -> str | None:
        """The local filesystem path that holds ``key`` as a plain file (``""``: the store's
        root directory), or ``None`` when values are not plain local files.

        Callers may read (and, unless :attr:`read_only`, write) that path directly instead of
        going through :meth:`get`/:meth:`set`.  ``key`` is validated like any key.
        """
        return None

    def no_follow_root(self) -> str | None:
        """With :meth:`local_path`: the local directory below which this store follows no
        symbolic link (callers opening :meth:`local_path` files directly must do the same,
        e.g. with :func:`ocdbt_py.kvstore.local.open_beneath`); ``None`` when not local."""
        return None

    def fsspec_location(self, key: str = "") -> tuple[Any, str] | None:
        """``(filesystem, path)`` of ``key`` when values are files of an fsspec filesystem that
        callers may stream to and list directly; ``None`` otherwise."""
        return None

    def stream_writer(self, key: str) -> Any:
        """A writer (``write(data)``, ``close()``, ``abort()``) that streams the new value of
        ``key`` to the backend as it is produced (a multipart upload), or ``None`` when the
        backend has none; nothing is visible at ``key`` until ``close()`` returns."""
        return None

    @property
    def syncs_later(self) -> bool:
        """Whether values written here are made durable in one batch later (a save's temporary
        directory) rather than each on its own; callers that write files at
        :meth:`local_path` directly then skip their own fsync and report each file to
        :meth:`note_written`."""
        return False

    def note_written(self, path: str) -> None:
        """A file below :meth:`local_path` was written directly, not through :meth:`set`
        (stores that :attr:`syncs_later` include it in their batch)."""

    def sync_all(self) -> None:
        """Make durable, at once, everything written so far (stores that :attr:`syncs_later`);
        nothing to do elsewhere, where each write is durable on its own."""

    @property
    def supports_conditional_writes(self) -> bool:
        """Whether :meth:`get_with_generation`/:meth:`set_if` are implemented (needed to
        commit an OCDBT database).  A backend that implements them but finds at run time that
        it cannot make them atomic raises :class:`UnsupportedError` from them instead."""
        return type(self).set_if is not KvStore.set_if

    @property
    def supports_read_into(self) -> bool:
        """Whether :meth:`read_into` reads ranges straight into caller-provided buffers."""
        return False

    def read_into(
        self, requests: Sequence[tuple[str, int, memoryview]]
    ) -> builtins.list[concurrent.futures.Future[int | None]]:
        """Start reading ``len(buf)`` bytes of each ``key`` from offset ``start`` into ``buf``;
        each future gives the number of bytes read, or ``None`` when the key is absent.
        Only where :attr:`supports_read_into`."""
        raise UnsupportedError(f"{self.url} cannot read into buffers")

    @property
    def supports_read_parts(self) -> bool:
        """Whether :meth:`read_parts` reads a range as consecutive parts, each available as
        soon as it arrives (so a reader can start on the first before the last is in)."""
        return False

    def read_parts(self, key: str, lo: int, hi: int
                   ) -> builtins.list[tuple[int, concurrent.futures.Future[Any]]]:
        """Start reading bytes ``[lo, hi)`` of ``key`` as consecutive parts: ``(offset,
        future)`` in offset order, each part ending where the next starts (the last at
        ``hi``).  A future gives the part's bytes (a bytes-like object, or a list of them
        holding consecutive pieces; shorter, or empty, where the object ends first), or
        ``None`` when the key is absent.  Only where
        :attr:`supports_read_parts`."""
        raise UnsupportedError(f"{self.url} cannot read in parts")

    @property
    def supports_read_ahead(self) -> bool:
        """Whether :meth:`read_ahead` starts fetches that later reads take over (stores where
        every request pays a network round trip)."""
        return False

    def read_ahead(self, requests: Sequence[tuple[str, tuple[int, int]]]) -> bool:
        """Start fetching these ``(key, (start, stop))`` ranges now, for reads that follow.
        Returns ``False`` when nothing was started (not supported, or refused keys: the reads
        themselves then say what is wrong)."""
        return False

    @property
    def is_remote(self) -> bool:
        """Whether each request pays network latency (batch reads and keep many in flight),
        as opposed to local disk or memory (one read per worker)."""
        return False

    @property
    def lists_sizes(self) -> bool:
        """Whether :meth:`list_sized` returns sizes (object-store listings), so a listing of a
        whole directory tree is cheap and tells how large every file is."""
        return False

    @property
    def renames_atomically(self) -> bool:
        """Whether a directory written under a temporary name and renamed appears atomically
        (local filesystems, memory).  ``False`` for object stores, where a commit marker file
        written last is the only commit point."""
        return True

    def close(self) -> None:
        """Release resources held by the store (connections, file handles)."""

    def __enter__(self) -> KvStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
