"""Opt-in conditional writes for storage that cannot make them atomic.

:class:`SingleWriterStore` wraps a store without compare-and-swap (a generic fsspec
filesystem, say) and implements :meth:`get_with_generation` / :meth:`set_if` by reading,
comparing and writing under a lock held in this process.  That is correct when exactly one
process writes; with two writer processes, commits can be lost.  It is only ever used when the
caller asks for it with ``storage_options={"single_writer": True}``.

The generation token is a hash of the value, so it changes whenever the content does.
"""

from __future__ import annotations

import hashlib
import threading

from ocdbt_py.errors import ConditionFailedError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.wrapper import WrapperStore

__all__ = ["SingleWriterStore", "content_token"]


def content_token(value: bytes) -> str:
    """The generation token of ``value``: a hash of its bytes."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


class SingleWriterStore(WrapperStore):
    """``base`` plus conditional writes that are atomic only within this process; everything
    else (capabilities included) is the wrapped store's."""

    #: deleting goes through this store's lock, key by key
    withheld = frozenset({"delete_prefix"})

    def __init__(self, base: KvStore):
        super().__init__(base)
        self._lock = threading.RLock()

    @property
    def supports_conditional_writes(self) -> bool:
        return True

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
