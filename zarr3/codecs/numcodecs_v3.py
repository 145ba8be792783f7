"""zarr-python 3's ``numcodecs.*`` v3 codecs.

``numcodecs.<filter>`` (delta, fixedscaleoffset, quantize, bitround, packbits, astype) are
array -> array codecs that run the numcodecs filter on the chunk flattened in C order and
reshape the result (``packbits`` to ``(1 + ceil(n / 8),)`` ``uint8``).  ``numcodecs.<compressor>``
(zlib, gzip, bz2, lzma, lz4, zstd, blosc, shuffle, crc32, adler32, crc32c) are bytes -> bytes
codecs backed by the same implementations as the v2 compressors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from zarr3.codecs._filter import FILTERS, Filter
from zarr3.codecs.base import ArrayArrayCodec, Buffer, BytesBytesCodec, ChunkSpec
from zarr3.dtypes import data_type_from_numpy
from zarr3.errors import MetadataError, UnsupportedError

__all__ = ["NumcodecsArrayCodec", "NumcodecsBytesCodec", "PREFIX", "numcodecs_codec", "use_compressor_parser"]

PREFIX = "numcodecs."
#: numcodecs filters usable as v3 array -> array codecs
ARRAY_FILTERS = ("delta", "fixedscaleoffset", "quantize", "bitround", "packbits", "astype")


class NumcodecsArrayCodec(ArrayArrayCodec):
    """A numcodecs filter as a v3 array -> array codec (``numcodecs.delta`` ...)."""

    name = "numcodecs"

    def __init__(self, flt: Filter):
        self.filter = flt
        self.name = PREFIX + flt.codec_id  # type: ignore[misc]

    @classmethod
    def from_config(cls, config: Any, field: str) -> NumcodecsArrayCodec:  # pragma: no cover
        raise MetadataError(field, config, "use numcodecs_codec()")

    def configuration(self) -> dict[str, Any] | None:
        return self.filter.config()

    def _encoded_dtype(self, spec: ChunkSpec) -> np.dtype[Any]:
        return self.filter.encoded_dtype(spec.dtype.dtype).newbyteorder("=")

    def encoded_spec(self, spec: ChunkSpec) -> ChunkSpec:
        dtype = self._encoded_dtype(spec)
        n = self.filter.encoded_count(spec.size, spec.dtype.dtype)
        if n is None:  # pragma: no cover - resolve() rejects variable-size filters
            raise MetadataError("codecs", self.name, "not usable as an array -> array codec")
        shape = spec.shape if n == spec.size else (n,)
        dt = data_type_from_numpy(dtype)
        return ChunkSpec(tuple(int(s) for s in shape), dt, None)

    def resolve(self, spec: ChunkSpec, field: str) -> NumcodecsArrayCodec:
        if spec.dtype.variable or self.filter.encoded_count(spec.size, spec.dtype.dtype) is None:
            raise MetadataError(f"{field}.name", self.name, f"not usable on {spec.dtype.name} data")
        return self

    def encode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        out_spec = self.encoded_spec(spec)
        out = np.asarray(self.filter.encode(np.ascontiguousarray(arr).reshape(-1)))
        return out.astype(out_spec.dtype.dtype, copy=False).reshape(out_spec.shape)

    def decode(self, arr: np.ndarray, spec: ChunkSpec) -> np.ndarray:
        out = np.asarray(self.filter.decode(np.ascontiguousarray(arr)))
        if out.size != spec.size:
            raise CorruptionError(f"{self.name} decoded {out.size} elements, expected {spec.size}")
        return out.astype(spec.dtype.dtype, copy=False).reshape(spec.shape)


class NumcodecsBytesCodec(BytesBytesCodec):
    """A numcodecs compressor or checksum as a v3 bytes -> bytes codec (``numcodecs.zlib`` ...)."""

    name = "numcodecs"

    def __init__(self, codec_id: str, config: dict[str, Any], inner: BytesBytesCodec):
        self.codec_id = codec_id
        self.config = config
        self.inner = inner
        self.name = PREFIX + codec_id  # type: ignore[misc]

    @classmethod
    def from_config(cls, config: Any, field: str) -> NumcodecsBytesCodec:  # pragma: no cover
        raise MetadataError(field, config, "use numcodecs_codec()")

    def configuration(self) -> dict[str, Any] | None:
        return dict(self.config)

    def resolve(self, spec: ChunkSpec, field: str) -> NumcodecsBytesCodec:
        inner = self.inner.resolve(spec, field)
        assert isinstance(inner, BytesBytesCodec)
        return NumcodecsBytesCodec(self.codec_id, self.config, inner)

    def encode(self, data: Buffer) -> Buffer:
        return self.inner.encode(data)

    def decode(self, data: Buffer, size: int | None, bound: int) -> Buffer:
        return self.inner.decode(data, size, bound)

    def encoded_size(self, decoded_size: int | None) -> int | None:
        return self.inner.encoded_size(decoded_size)

    def max_encoded_size(self, decoded_size: int) -> int:
        return self.inner.max_encoded_size(decoded_size)


_compressor_from_v2: Callable[[Any, int, str], BytesBytesCodec | None] | None = None


def use_compressor_parser(parse: Callable[[Any, int, str], BytesBytesCodec | None]) -> None:
    """Install the v2 compressor parser (the codec registry does, at import; it imports this
    module, so this module cannot import it)."""
    global _compressor_from_v2
    _compressor_from_v2 = parse


def numcodecs_codec(name: str, config: Any, field: str, itemsize: int) -> ArrayArrayCodec | BytesBytesCodec:
    """Build the codec for a v3 ``numcodecs.<id>`` entry."""
    assert _compressor_from_v2 is not None, "zarr3.codecs installs the compressor parser"
    compressor_from_v2 = _compressor_from_v2
    cid = name[len(PREFIX) :]
    cfg = {} if config is None else config
    if not isinstance(cfg, dict):
        raise MetadataError(f"{field}.configuration", config, "expected an object")
    if cid in ARRAY_FILTERS:
        return NumcodecsArrayCodec(FILTERS[cid].from_config(cfg, f"{field}.configuration"))
    if cid in FILTERS and not FILTERS[cid].variable and cid != "shuffle":
        raise UnsupportedError(f"v3 codec {name!r}", "is not supported (numcodecs has no v3 form of it)")
    inner = compressor_from_v2({**cfg, "id": cid}, itemsize, f"{field}.configuration")
    if inner is None:  # pragma: no cover - an id is always given
        raise MetadataError(f"{field}.name", name, "unknown codec")
    return NumcodecsBytesCodec(cid, cfg, inner)
