"""One version of a database as readers and transactions see it: its B+tree root and the
reader of its nodes, plus the key-range arithmetic every listing shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Union

from ocdbt_py.errors import InvalidKeyError
from ocdbt_py.format.btree import MAX_KEY_LENGTH
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.read.btree_read import iterate, lookup
from ocdbt_py.read.node_reader import NodeReader

__all__ = ["Snapshot", "KeyLike", "to_key", "prefix_end", "key_bounds"]

#: What key arguments accept: bytes-like, or ``str`` (encoded as UTF-8).
KeyLike = Union[bytes, bytearray, memoryview, str]


def to_key(key: KeyLike) -> bytes:
    """A key argument as ``bytes``; ``TypeError`` for other types, :class:`InvalidKeyError`
    for keys longer than OCDBT allows."""
    if isinstance(key, str):
        k = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        k = bytes(key)
    else:
        raise TypeError(f"keys are bytes or str, not {type(key).__name__}")
    if len(k) > MAX_KEY_LENGTH:
        raise InvalidKeyError(f"key of {len(k)} bytes exceeds {MAX_KEY_LENGTH}")
    return k


def prefix_end(p: bytes) -> bytes | None:
    """Smallest key greater than every key with prefix ``p`` (``None``: no bound)."""
    b = bytearray(p)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return None
    b[-1] += 1
    return bytes(b)


def key_bounds(prefix: KeyLike, start: KeyLike | None, stop: KeyLike | None) -> tuple[bytes, bytes | None]:
    """The half-open range ``[lo, hi)`` of keys that have ``prefix`` and lie in ``[start, stop)``."""
    p = to_key(prefix)
    lo = p
    hi = prefix_end(p)
    if start is not None:
        lo = max(lo, to_key(start))
    if stop is not None:
        s = to_key(stop)
        hi = s if hi is None else min(hi, s)
    return lo, hi


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A fixed version's B+tree (``root`` is ``None`` for an empty tree) and its node reader."""

    root: IndirectDataReference | None
    height: int
    reader: NodeReader

    def lookup(self, key: bytes) -> bytes | IndirectDataReference | None:
        """The stored entry of ``key``: inline bytes, a data-file reference, or ``None``."""
        return lookup(self.reader, (self.root, self.height), key)

    def read(self, ref: IndirectDataReference) -> bytes:
        """The value a data-file reference points to."""
        return bytes(self.reader.read(ref))

    def keys(self, lo: bytes, hi: bytes | None) -> Iterator[bytes]:
        """The keys in ``[lo, hi)``, in order."""
        for k, _ in iterate(self.reader, (self.root, self.height), lo, hi):
            yield k
