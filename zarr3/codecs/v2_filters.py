"""The zarr v2 ``filters`` pipeline as one array -> bytes codec.

zarr-python 2 (and zarr-python 3 writing v2) encode a chunk by flattening it in memory order
(after our ``transpose`` for ``order: "F"``), running each filter's ``encode`` in turn and
handing the last result's bytes to the compressor; decoding runs the filters' ``decode`` in
reverse and re-reads the result as the array's stored dtype.  An object codec
(``vlen-utf8``, ``vlen-bytes``, ``json2``, ``categorize``) turns object/string elements into
bytes and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import Filter, raw_view
from zarr3.codecs._vlen import MAX_VLEN_CHUNK_NBYTES
from zarr3.codecs.base import ArrayBytesCodec, Buffer, ChunkSpec
from zarr3.dtypes import native_order
from zarr3.errors import MetadataError

__all__ = ["V2FilterCodec"]


class V2FilterCodec(ArrayBytesCodec):
    """Serialise a chunk of ``stored`` dtype through numcodecs ``filters``."""

    name = "bytes"

    def __init__(self, filters: Sequence[Filter], stored: np.dtype[Any]):
        self.filters = list(filters)
        self.stored = stored

    @classmethod
    def from_config(cls, config: Any, field: str) -> V2FilterCodec:  # pragma: no cover
        raise MetadataError(field, config, "v2 filters exist only in zarr v2 metadata")

    def configuration(self) -> dict[str, Any] | None:
        return None

    def to_v2(self) -> list[dict[str, Any]] | None:
        """The v2 ``filters`` member."""
        return [f.to_v2() for f in self.filters] or None

    def _final(self, spec: ChunkSpec) -> tuple[int | None, np.dtype[Any]]:
        n: int | None = spec.size
        dtype = self.stored
        for f in self.filters:
            if n is None:
                return None, dtype
            n = f.encoded_count(n, dtype)
            dtype = f.encoded_dtype(dtype)
        return n, dtype

    def encoded_size(self, spec: ChunkSpec) -> int | None:
        n, dtype = self._final(spec)
        return None if n is None or spec.dtype.variable else n * dtype.itemsize

    def max_encoded_size(self, spec: ChunkSpec) -> int:
        exact = self.encoded_size(spec)
        if exact is not None:
            return exact
        return MAX_VLEN_CHUNK_NBYTES

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> Buffer:
        if spec.dtype.variable:
            x: Any = np.asarray(arr).reshape(-1)
        else:
            x = np.ascontiguousarray(arr).astype(self.stored, copy=False).reshape(-1)
        for f in self.filters:
            x = f.encode(x)
        out = np.asarray(x)
        if out.dtype.hasobject or out.dtype.kind == "T":
            raise MetadataError("filters", self.to_v2(), "object data needs an object codec (e.g. vlen-utf8) first")
        return np.ascontiguousarray(out).reshape(-1).view(np.uint8).data

    def decode(self, data: Buffer, spec: ChunkSpec) -> np.ndarray:
        x: Any = np.frombuffer(data, dtype=np.uint8)
        for f in reversed(self.filters):
            x = f.decode(x)
        x = np.asarray(x).reshape(-1)
        if spec.dtype.variable:
            if x.size != spec.size:
                raise CorruptionError(f"chunk holds {x.size} elements after its filters, expected {spec.size}")
            out = x.reshape(spec.shape)
            return out if out.dtype == spec.dtype.dtype else out.astype(spec.dtype.dtype)
        if x.dtype.kind in "SU" and spec.dtype.kind in ("bytes", "unicode"):
            vals = x.astype(spec.dtype.dtype)  # categorize returns its own string width
        else:
            vals = raw_view(x, self.stored, "filters")
        if vals.size != spec.size:
            raise CorruptionError(f"chunk holds {vals.size} elements after its filters, expected {spec.size}")
        vals = vals.reshape(spec.shape)
        if not native_order(vals.dtype) or vals.dtype != spec.dtype.dtype:
            vals = vals.astype(spec.dtype.dtype)
        return vals
