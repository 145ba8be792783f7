"""numcodecs' variable-length layout: ``<u4`` item count, then per item ``<u4`` length + bytes.

Shared by ``vlen-utf8`` and ``vlen-bytes`` (v2 object codecs and v3 array -> bytes codecs).
Decoding never allocates more than the input: the count and every length are checked against
the bytes that remain.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError

__all__ = ["pack_items", "unpack_items", "MAX_VLEN_CHUNK_NBYTES"]

#: Bound of a decoded (decompressed) chunk of variable-length elements: 1 GiB.
MAX_VLEN_CHUNK_NBYTES = 1 << 30

_U32 = struct.Struct("<I")


def pack_items(items: Iterable[bytes]) -> bytes:
    """Encode byte strings in the vlen layout."""
    parts: list[bytes] = []
    n = 0
    for item in items:
        parts.append(_U32.pack(len(item)))
        parts.append(item)
        n += 1
    return _U32.pack(n) + b"".join(parts)


def unpack_items(buf: Any, what: str, expected: int | None = None) -> list[bytes]:
    """Decode the vlen layout into byte strings; any inconsistency is a CorruptionError."""
    raw: Any = np.ascontiguousarray(np.asarray(buf)).reshape(-1).view(np.uint8)
    data = memoryview(raw).cast("B")
    total = len(data)
    if total < 4:
        raise CorruptionError(f"{what}: {total} bytes is shorter than the item count header")
    (count,) = _U32.unpack_from(data, 0)
    if expected is not None and count != expected:
        raise CorruptionError(f"{what}: chunk holds {count} items, expected {expected}")
    if count > (total - 4) // 4:
        raise CorruptionError(f"{what}: {count} items cannot fit in {total} bytes")
    out: list[bytes] = []
    pos = 4
    for _ in range(count):
        if pos + 4 > total:
            raise CorruptionError(f"{what}: truncated at item {len(out)}")
        (n,) = _U32.unpack_from(data, pos)
        pos += 4
        if n > total - pos:
            raise CorruptionError(f"{what}: item {len(out)} of {n} bytes runs past the chunk")
        out.append(bytes(data[pos : pos + n]))
        pos += n
    if pos != total:
        raise CorruptionError(f"{what}: {total - pos} trailing bytes after {count} items")
    return out
