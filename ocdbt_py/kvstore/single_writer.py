"""Opt-in conditional writes for storage that cannot make them atomic.

:class:`SingleWriterStore` wraps a store without compare-and-swap (a generic fsspec
filesystem, say) and implements :meth:`get_with_generation` / :meth:`set_if` by reading,
comparing and writing under a lock held in this process.  That is correct when exactly one
process writes; with two writer processes, commits can be lost.  It is only ever used when the
caller asks for it with ``storage_options={"single_writer": True}``.

The generation token is a hash of the value, so it changes whenever the content does.
"""

from __future__ import annotations

import builtins
import hashlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.errors import ConditionFailedError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest

__all__ = ["SingleWriterStore", "content_token"]


def content_token(value: bytes) -> str:
    """The generation token of ``value``: a hash of its bytes."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


class SingleWriterStore(KvStore):
    """``base`` plus conditional writes that are atomic only within this process."""

    def __init__(self, base: KvStore):
        self.base = base
        self.read_only = base.read_only
        self._lock = threading.RLock()

    @property
    def url(self) -> str:
        return self.base.url

    # -- capabilities: everything but conditional writes (ours) is the wrapped store's ------
    def local_path(self, key: str = "") -> str | None:
        return self.base.local_path(key)

    def no_follow_root(self) -> str | None:
        return self.base.no_follow_root()

    def fsspec_location(self, key: str = "") -> tuple[Any, str] | None:
        return self.base.fsspec_location(key)

    @property
    def is_remote(self) -> bool:
        return self.base.is_remote

    @property
    def lists_sizes(self) -> bool:
        return self.base.lists_sizes

    @property
    def renames_atomically(self) -> bool:
        return self.base.renames_atomically

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.base.get(key, byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> builtins.list[bytes | None]:
        return self.base.get_many(requests)

    def size(self, key: str) -> int | None:
        return self.base.size(key)

    def list(self, prefix: str = "", *, start: str | None = None, stop: str | None = None) -> Iterator[str]:
        return self.base.list(prefix, start=start, stop=stop)

    def list_dir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        return self.base.list_dir(prefix)

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self.base.set(key, value)

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.base.set_parts(key, parts)

    def delete(self, key: str) -> None:
        with self._lock:
            self.base.delete(key)

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        with self._lock:
            value = self.base.get(key)
        return (None, None) if value is None else (value, content_token(value))

    def set_if(self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None) -> str:
        data = bytes(value)
        with self._lock:
            current = self.base.get(key)
            token = None if current is None else content_token(current)
            if token != if_generation:
                want = "absent" if if_generation is None else f"at generation {if_generation}"
                raise ConditionFailedError(f"conditional write of {self.url}/{key} failed: it is no longer {want}")
            self.base.set(key, data)
        return content_token(data)

    def close(self) -> None:
        self.base.close()
