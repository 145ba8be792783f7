"""``vlen-bytes``: variable-length byte strings (v3 ``variable_length_bytes``; v2 ``|O``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zarr3.codecs._filter import Filter, check_keys, register_filter
from zarr3.codecs._vlen import MAX_VLEN_CHUNK_NBYTES, pack_items, unpack_items
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec, check_config
from zarr3.errors import MetadataError

__all__ = ["VlenBytesCodec", "VlenBytesFilter", "encode_bytes_items", "decode_bytes_items"]


def encode_bytes_items(arr: np.ndarray) -> bytes:
    """Encode an object array of bytes in C order (``None`` as empty)."""
    items = []
    for x in np.asarray(arr).reshape(-1).tolist():
        if x is None:
            x = b""
        if isinstance(x, str):
            x = x.encode("utf-8")
        if not isinstance(x, (bytes, bytearray, memoryview)):
            raise TypeError(f"vlen-bytes can only encode bytes, not {type(x).__name__}")
        items.append(bytes(x))
    return pack_items(items)


def decode_bytes_items(buf: Any, expected: int | None = None) -> np.ndarray:
    """Decode into a flat object array of bytes."""
    items = unpack_items(buf, "vlen-bytes", expected)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


@register_filter
class VlenBytesFilter(Filter):
    """The v2 object codec ``{"id": "vlen-bytes"}``."""

    codec_id = "vlen-bytes"
    variable = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> VlenBytesFilter:
        check_keys(config, (), field)
        return cls()

    def config(self) -> dict[str, Any]:
        return {}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int | None:
        return None

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return np.frombuffer(encode_bytes_items(arr), dtype=np.uint8)

    def decode(self, buf: Any) -> np.ndarray:
        return decode_bytes_items(buf)


class VlenBytesCodec(ArrayBytesCodec):
    """The v3 array -> bytes codec ``vlen-bytes`` for ``variable_length_bytes`` arrays."""

    name = "vlen-bytes"

    @classmethod
    def from_config(cls, config: Any, field: str) -> VlenBytesCodec:
        check_config(config, (), field)
        return cls()

    def configuration(self) -> dict[str, Any] | None:
        return {}

    def resolve(self, spec: ChunkSpec, field: str) -> VlenBytesCodec:
        if spec.dtype.kind not in ("vbytes", "object"):
            raise MetadataError(f"{field}.name", self.name, f"needs a bytes data type, not {spec.dtype.name}")
        return self

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        return MAX_VLEN_CHUNK_NBYTES

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        return encode_bytes_items(arr)

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        return decode_bytes_items(data, spec.size).reshape(spec.shape)
