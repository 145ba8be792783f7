"""The ``bytes`` array -> bytes codec: the chunk's elements in C order, little or big endian.

TensorStore omits the configuration for 1-byte types (``{"name":"bytes"}``) and writes
``{"endian": "little"}`` otherwise; an absent ``endian`` reads as little endian.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec, check_config
from zarr3.dtypes import DataType
from zarr3.errors import MetadataError

__all__ = ["BytesCodec", "swap_bytes"]

_NATIVE = sys.byteorder


def swap_bytes(arr: np.ndarray, dt: DataType) -> np.ndarray:
    """Return a byte-swapped copy of ``arr`` (each element, or each complex component)."""
    if dt.kind in ("raw", "bytes", "struct") or dt.itemsize == 1:
        return np.array(arr, copy=True)
    unit = 4 if dt.kind == "unicode" else dt.component.itemsize
    flat = np.ascontiguousarray(arr).reshape(-1).view(f"u{unit}")
    return flat.byteswap().view(dt.dtype).reshape(arr.shape)


class BytesCodec(ArrayBytesCodec):
    """Serialise a chunk as its raw element bytes."""

    name = "bytes"

    def __init__(self, endian: str | None = "little"):
        if endian not in ("little", "big", None):
            raise MetadataError("endian", endian, 'expected "little" or "big"')
        self.endian = endian

    @classmethod
    def from_config(cls, config: Any, field: str) -> BytesCodec:
        cfg = check_config(config, ("endian",), field)
        endian = cfg.get("endian", "little")
        if endian not in ("little", "big"):
            raise MetadataError(f"{field}.endian", endian, 'expected "little" or "big"')
        return cls(endian)

    def configuration(self) -> dict[str, Any] | None:
        if self.endian is None:
            return None
        return {"endian": self.endian}

    def resolve(self, spec: ChunkSpec, field: str) -> BytesCodec:
        if spec.dtype.variable:
            raise MetadataError(
                f"{field}.name", self.name, f"{spec.dtype.name} has no fixed size; use vlen-utf8 or vlen-bytes"
            )
        if spec.dtype.itemsize == 1 or spec.dtype.kind in ("raw", "bytes", "struct"):
            return BytesCodec(None)
        return BytesCodec(self.endian or "little")

    @property
    def native(self) -> bool:
        """Whether encoded bytes equal the in-memory bytes on this machine."""
        return self.endian is None or self.endian == _NATIVE

    def encoded_size(self, spec: ChunkSpec) -> int:
        return spec.nbytes

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        return spec.nbytes

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        if not self.native:
            arr = swap_bytes(arr, spec.dtype)
        else:
            arr = np.ascontiguousarray(arr)
        return arr.reshape(-1).view(np.uint8).data

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        n = spec.nbytes
        if len(data) != n:
            raise CorruptionError(
                f"chunk holds {len(data)} bytes after decoding, expected {n} "
                f"for shape {list(spec.shape)} of {spec.dtype.name}"
            )
        arr = np.frombuffer(data, dtype=spec.dtype.dtype).reshape(spec.shape)
        if not self.native:
            arr = swap_bytes(arr, spec.dtype)
        return arr


class StructBytesCodec(ArrayBytesCodec):
    """zarr v2 structured elements: the stored (per-field byte order) record layout.

    Only used inside v2 codec chains; zarr v3 has no structured data types.
    """

    name = "bytes"

    def __init__(self, stored: np.dtype[Any]):
        self.stored = stored

    @classmethod
    def from_config(cls, config: Any, field: str) -> StructBytesCodec:  # pragma: no cover
        raise MetadataError(field, config, "structured data types exist only in zarr v2")

    def configuration(self) -> dict[str, Any] | None:
        return None

    def encoded_size(self, spec: ChunkSpec) -> int:
        return spec.size * self.stored.itemsize

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        return spec.size * self.stored.itemsize

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        out = np.ascontiguousarray(arr.astype(self.stored, copy=False))
        return out.reshape(-1).view(np.uint8).data

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        n = spec.size * self.stored.itemsize
        if len(data) != n:
            raise CorruptionError(
                f"chunk holds {len(data)} bytes after decoding, expected {n} "
                f"for shape {list(spec.shape)} of a structured dtype"
            )
        arr = np.frombuffer(data, dtype=self.stored).reshape(spec.shape)
        if self.stored != spec.dtype.dtype:
            arr = arr.astype(spec.dtype.dtype)
        return arr
