"""numcodecs' variable-length layout: ``<u4`` item count, then per item ``<u4`` length + bytes.

Shared by ``vlen-utf8`` and ``vlen-bytes`` (v2 object codecs and v3 array -> bytes codecs).
Decoding never allocates more than the input: the count and every length are checked against
the bytes that remain.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, check_keys
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec, check_config
from zarr3.errors import MetadataError

__all__ = ["pack_items", "unpack_items", "MAX_VLEN_CHUNK_NBYTES", "VlenFilter", "VlenCodec"]

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


class VlenFilter(Filter):
    """A v2 object codec of this layout (``vlen-utf8``, ``vlen-bytes``): subclasses name it and
    give :attr:`encode_items` / :attr:`decode_items`."""

    variable = True
    #: ``(array) -> bytes`` and ``(buffer, expected count) -> flat array``, as static methods
    encode_items: ClassVar[staticmethod[[np.ndarray], bytes]]
    decode_items: ClassVar[staticmethod[[Any, int | None], np.ndarray]]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> VlenFilter:
        check_keys(config, (), field)
        return cls()

    def config(self) -> dict[str, Any]:
        return {}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int | None:
        return None

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return np.frombuffer(self.encode_items(arr), dtype=np.uint8)

    def decode(self, buf: Any) -> np.ndarray:
        return self.decode_items(buf, None)


class VlenCodec(ArrayBytesCodec):
    """A v3 array -> bytes codec of this layout: subclasses name it, the data type kinds it
    serves (:attr:`kinds`, described by :attr:`kind_text`) and its item functions."""

    kinds: ClassVar[tuple[str, ...]]
    kind_text: ClassVar[str]
    encode_items: ClassVar[staticmethod[[np.ndarray], bytes]]
    decode_items: ClassVar[staticmethod[[Any, int | None], np.ndarray]]

    @classmethod
    def from_config(cls, config: Any, field: str) -> VlenCodec:
        check_config(config, (), field)
        return cls()

    def configuration(self) -> dict[str, Any] | None:
        return {}

    def resolve(self, spec: ChunkSpec, field: str) -> VlenCodec:
        if spec.dtype.kind not in self.kinds:
            raise MetadataError(f"{field}.name", self.name,
                                f"needs a {self.kind_text} data type, not {spec.dtype.name}")
        return self

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        return MAX_VLEN_CHUNK_NBYTES

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        return self.encode_items(arr)

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        out = self.decode_items(data, spec.size).reshape(spec.shape)
        return out if out.dtype == spec.dtype.dtype else out.astype(spec.dtype.dtype)
