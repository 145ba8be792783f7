"""An in-memory :class:`KvStore`, thread-safe, with atomic conditional writes."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from ocdbt_py.errors import ConditionFailedError, ReadOnlyError
from ocdbt_py.kvstore.base import ByteRange, KvStore, check_range, slice_range
from ocdbt_py.kvstore.keys import validate_key, validate_prefix

__all__ = ["MemoryStore"]


class MemoryStore(KvStore):
    """A dict-backed store.  Keys are kept sorted so listing is ordered and cheap."""

    def __init__(self, data: dict[str, bytes] | None = None, *, read_only: bool = False):
        self._lock = threading.RLock()
        self._data: dict[str, bytes] = {}
        self._gen: dict[str, int] = {}
        self._sorted: list[bytes] = []
        self._counter = 0
        for k, v in (data or {}).items():
            self._put(validate_key(k), bytes(v))
        self.read_only = read_only

    @property
    def url(self) -> str:
        return f"<MemoryStore {id(self):#x}>"

    def _put(self, key: str, value: bytes) -> str:
        if key not in self._data:
            bisect.insort(self._sorted, key.encode())
        self._data[key] = value
        self._counter += 1
        self._gen[key] = self._counter
        return str(self._counter)

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        validate_key(key)
        check_range(byte_range)
        with self._lock:
            value = self._data.get(key)
        return None if value is None else slice_range(value, byte_range)

    def size(self, key: str) -> int | None:
        validate_key(key)
        with self._lock:
            value = self._data.get(key)
        return None if value is None else len(value)

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        validate_prefix(prefix)
        lo = prefix.encode()
        if start is not None and start.encode() > lo:
            lo = start.encode()
        with self._lock:
            i = bisect.bisect_left(self._sorted, lo)
            snapshot = self._sorted[i:]
        p = prefix.encode()
        hi = None if stop is None else stop.encode()
        for k in snapshot:
            if not k.startswith(p):
                break
            if hi is not None and k >= hi:
                break
            yield k.decode()

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        validate_key(key)
        self._check_writable()
        with self._lock:
            self._put(key, bytes(value))

    def delete(self, key: str) -> None:
        validate_key(key)
        self._check_writable()
        with self._lock:
            if key in self._data:
                del self._data[key]
                del self._gen[key]
                kb = key.encode()
                i = bisect.bisect_left(self._sorted, kb)
                del self._sorted[i]

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        validate_key(key)
        with self._lock:
            if key not in self._data:
                return None, None
            return self._data[key], str(self._gen[key])

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        validate_key(key)
        self._check_writable()
        with self._lock:
            current = str(self._gen[key]) if key in self._data else None
            if current != if_generation:
                raise ConditionFailedError(
                    f"conditional write of {key!r} failed: generation is {current}, "
                    f"expected {if_generation}"
                )
            return self._put(key, bytes(value))
