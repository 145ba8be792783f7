"""numcodecs ``shuffle``: byte ``j`` of every element grouped together (a v2 filter, or the v3
``numcodecs.shuffle`` bytes -> bytes codec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, check_keys, register_filter
from zarr3.codecs.base import Buffer, BytesBytesCodec, ChunkSpec
from zarr3.errors import MetadataError

__all__ = ["ShuffleFilter", "ShuffleCodec", "shuffle_bytes", "unshuffle_bytes"]


def _bytes_of(buf: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(buf)).reshape(-1).view(np.uint8)


def shuffle_bytes(buf: Any, elementsize: int) -> np.ndarray:
    """Group byte ``j`` of every ``elementsize``-byte element together."""
    raw = _bytes_of(buf)
    if elementsize <= 1:
        return raw.copy()
    if raw.size % elementsize:
        raise ValueError(f"shuffle: {raw.size} bytes is not a multiple of elementsize {elementsize}")
    return np.ascontiguousarray(raw.reshape(-1, elementsize).T).reshape(-1)


def unshuffle_bytes(buf: Any, elementsize: int) -> np.ndarray:
    """Undo :func:`shuffle_bytes`."""
    raw = _bytes_of(buf)
    if elementsize <= 1:
        return raw.copy()
    if raw.size % elementsize:
        raise CorruptionError(f"shuffle: {raw.size} bytes is not a multiple of elementsize {elementsize}")
    return np.ascontiguousarray(raw.reshape(elementsize, -1).T).reshape(-1)


@register_filter
class ShuffleFilter(Filter):
    """``{"id": "shuffle", "elementsize": 4}``."""

    codec_id = "shuffle"

    def __init__(self, elementsize: int = 4):
        self.elementsize = elementsize

    @classmethod
    def from_config(cls, config: Mapping[str, Any], field: str) -> ShuffleFilter:
        check_keys(config, ("elementsize",), field)
        size = config.get("elementsize", 4)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 1 << 20:
            raise MetadataError(f"{field}.elementsize", size, "expected a non-negative integer")
        return cls(size)

    def config(self) -> dict[str, Any]:
        return {"elementsize": self.elementsize}

    def encoded_dtype(self, dtype: np.dtype[Any]) -> np.dtype[Any]:
        return np.dtype("u1")

    def encoded_count(self, n: int, dtype: np.dtype[Any]) -> int:
        return n * dtype.itemsize

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return shuffle_bytes(arr, self.elementsize)

    def decode(self, buf: Any) -> np.ndarray:
        return unshuffle_bytes(buf, self.elementsize)


class ShuffleCodec(BytesBytesCodec):
    """``shuffle`` as a bytes -> bytes codec (v2 compressor / v3 ``numcodecs.shuffle``);
    ``elementsize`` defaults to the element size, as zarr-python fills it in."""

    name = "shuffle"

    def __init__(self, elementsize: int | None = None):
        self.elementsize = elementsize

    @classmethod
    def from_config(cls, config: Any, field: str) -> ShuffleCodec:  # pragma: no cover
        raise MetadataError(field, config, "shuffle is a numcodecs codec (numcodecs.shuffle)")

    @classmethod
    def from_v2(cls, config: Mapping[str, Any], field: str) -> ShuffleCodec:
        """Build from ``{"id": "shuffle", "elementsize": n}``."""
        return cls(ShuffleFilter.from_config(config, field).elementsize if "elementsize" in config else None)

    def to_v2(self) -> dict[str, Any]:
        """The v2 compressor object."""
        return {"elementsize": self.elementsize or 4, "id": "shuffle"}

    def configuration(self) -> dict[str, Any]:
        return {"elementsize": self.elementsize}

    def resolve(self, spec: ChunkSpec, field: str) -> ShuffleCodec:
        return self if self.elementsize is not None else ShuffleCodec(spec.dtype.itemsize)

    def encode(self, data: Buffer) -> Buffer:
        return shuffle_bytes(np.frombuffer(data, np.uint8), self.elementsize or 4).tobytes()

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        if len(data) > bound or (size is not None and len(data) != size):
            raise CorruptionError(f"shuffle: {len(data)} bytes, expected {size or bound}")
        return unshuffle_bytes(np.frombuffer(data, np.uint8), self.elementsize or 4).tobytes()

    def encoded_size(self, decoded_size: int | None) -> int | None:
        return decoded_size

    def max_encoded_size(self, decoded_size: int) -> int:
        return decoded_size
