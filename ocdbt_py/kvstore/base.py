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
from typing import Union

from ocdbt_py.errors import ReadOnlyError, UnsupportedError

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
        workers = min(_DEFAULT_WORKERS, len(reqs))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda kr: self.get(kr[0], kr[1]), reqs))

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

    def close(self) -> None:
        """Release resources held by the store (connections, file handles)."""

    def __enter__(self) -> KvStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
