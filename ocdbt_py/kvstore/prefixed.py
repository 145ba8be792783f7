"""A view of another :class:`KvStore` below a fixed key prefix."""

from __future__ import annotations

import builtins
import concurrent.futures
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, normalize_request
from ocdbt_py.kvstore.keys import validate_key, validate_prefix

__all__ = ["PrefixStore"]


class PrefixStore(KvStore):
    """Keys ``k`` of this store are keys ``prefix + k`` of ``base``."""

    def __init__(self, base: KvStore, prefix: str):
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
            prefix += "/"
        self.base = base
        self.prefix = prefix
        self.read_only = base.read_only

    @property
    def url(self) -> str:
        base = self.base.url.rstrip("/")
        return f"{base}/{self.prefix}" if self.prefix else self.base.url

    def _k(self, key: str) -> str:
        validate_key(key)
        return self.prefix + key

    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        return self.base.get(self._k(key), byte_range)

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        return self.base.get_many([(self._k(k), r) for k, r in reqs])

    def size(self, key: str) -> int | None:
        return self.base.size(self._k(key))

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        validate_prefix(prefix)
        n = len(self.prefix)
        for key in self.base.list(
            self.prefix + prefix,
            start=None if start is None else self.prefix + start,
            stop=None if stop is None else self.prefix + stop,
        ):
            yield key[n:]

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int | None]]:
        validate_prefix(prefix)
        n = len(self.prefix)
        for key, size in self.base.list_sized(self.prefix + prefix):
            yield key[n:], size

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self.base.set(self._k(key), value)

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        self.base.set_parts(self._k(key), parts)

    def delete(self, key: str) -> None:
        self.base.delete(self._k(key))

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        return self.base.get_with_generation(self._k(key))

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        return self.base.set_if(self._k(key), value, if_generation=if_generation)

    # -- capabilities: all forwarded, with this view's prefix ------------------------------
    def local_path(self, key: str = "") -> str | None:
        return self.base.local_path(self._k(key) if key else self.prefix.rstrip("/"))

    def no_follow_root(self) -> str | None:
        return self.base.no_follow_root()

    def fsspec_location(self, key: str = "") -> tuple[Any, str] | None:
        return self.base.fsspec_location(self._k(key) if key else self.prefix.rstrip("/"))

    @property
    def syncs_later(self) -> bool:
        return self.base.syncs_later

    def note_written(self, path: str) -> None:
        self.base.note_written(path)

    @property
    def supports_conditional_writes(self) -> bool:
        return self.base.supports_conditional_writes

    @property
    def supports_read_into(self) -> bool:
        return self.base.supports_read_into

    def read_into(
        self, requests: Sequence[tuple[str, int, memoryview]]
    ) -> builtins.list[concurrent.futures.Future[int | None]]:
        return self.base.read_into([(self._k(k), start, buf) for k, start, buf in requests])

    @property
    def supports_read_ahead(self) -> bool:
        return self.base.supports_read_ahead

    def read_ahead(self, requests: Sequence[tuple[str, tuple[int, int]]]) -> bool:
        try:
            reqs = [(self._k(k), r) for k, r in requests]
        except (ValueError, TypeError):
            return False
        return self.base.read_ahead(reqs)

    @property
    def is_remote(self) -> bool:
        return self.base.is_remote

    @property
    def lists_sizes(self) -> bool:
        return self.base.lists_sizes

    @property
    def renames_atomically(self) -> bool:
        return self.base.renames_atomically
