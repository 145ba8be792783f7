"""A view of another :class:`KvStore` below a fixed key prefix."""

from __future__ import annotations

from collections.abc import Sequence

from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.keys import validate_key, validate_prefix
from ocdbt_py.kvstore.wrapper import WrapperStore

__all__ = ["PrefixStore"]


class PrefixStore(WrapperStore):
    """Keys ``k`` of this store are keys ``prefix + k`` of ``base``.

    Every member of ``base`` is forwarded (capabilities included), with this view's prefix.
    """

    renames_keys = True

    def __init__(self, base: KvStore, prefix: str):
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
            prefix += "/"
        super().__init__(base)
        self.prefix = prefix

    @property
    def url(self) -> str:
        base = self.base.url.rstrip("/")
        return f"{base}/{self.prefix}" if self.prefix else self.base.url

    def _inner(self, key: str, root: bool = False) -> str:
        if root and key == "":
            return self.prefix.rstrip("/")
        validate_key(key)
        return self.prefix + key

    def _inner_prefix(self, prefix: str) -> str:
        validate_prefix(prefix)
        return self.prefix + prefix

    def _inner_bound(self, bound: str | None) -> str | None:
        return None if bound is None else self.prefix + bound

    def _outer(self, key: str) -> str:
        return key[len(self.prefix):]

    def read_ahead(self, requests: Sequence[tuple[str, tuple[int, int]]]) -> bool:
        try:
            reqs = [(self._inner(k), r) for k, r in requests]
        except (ValueError, TypeError):
            return False  # refused keys: the reads themselves say what is wrong
        return self.base.read_ahead(reqs)

    def close(self) -> None:
        """Nothing to release: the wrapped store belongs to the caller."""
