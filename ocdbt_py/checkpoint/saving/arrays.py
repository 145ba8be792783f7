"""One array as Orbax stores it: Zarr metadata, chunk keys and chunk encoding.

* Zarr v2 (Orbax's default): ``<param>/.zarray`` (``compressor`` zstd level 1,
  ``fill_value`` null) and chunks ``<param>/i.j`` (``<param>/0`` for a 0-d array), each one
  zstd frame of the C-order little-endian bytes.
* Zarr v3 (``use_zarr3=True``): ``<param>/zarr.json`` with one ``sharding_indexed`` codec
  whose inner chunk equals the chunk grid (bytes + zstd level 3, index bytes + crc32c at the
  end), and chunks ``<param>/c/i/j`` (``<param>/c``): the inner chunk's encoding followed by
  the 16-byte index ``(offset 0, length)`` and its CRC-32C.
* With ``checksum``: v2 zstd frames carry their content checksum (the metadata is unchanged:
  the frame says so itself); v3 inner chunks end in the ``crc32c`` codec (the CRC-32C of the
  compressed bytes: ~20x cheaper than zstd's checksum of the uncompressed ones, and it also
  covers uncompressed chunks).

Metadata bytes come from :mod:`zarr3` and equal TensorStore's output byte for byte.  Chunks
are encoded straight from the caller's buffer (no copy for a contiguous whole chunk) and large
ones are compressed as a stream into the data file.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import crc32c as _crc32c_mod
import numpy as np
import zstandard

from ocdbt_py.format.envelope import crc32c
from ocdbt_py.write.bulk import StoredValue
from zarr3.codecs import BytesCodec, Crc32cCodec, ShardingCodec, ZstdCodec, compressor_from_v2
from zarr3.dtypes import ML_FLOAT_NAMES, ML_INT_NAMES, data_type_from_numpy, v2_dtype_string
from zarr3.fill_value import default_fill_value
from zarr3.metadata_v2 import ArrayMetadataV2
from zarr3.metadata_v3 import ArrayMetadataV3

__all__ = ["ArraySpec", "storage_dtype", "zarr_metadata", "chunk_regions", "encode_chunk", "encode_small",
           "encode_small_batch", "Compressors", "ONE_SHOT_BYTES", "ChunkSink"]

#: Chunks at most this large are compressed in one call; larger ones are streamed.
ONE_SHOT_BYTES = 1 << 20
#: Larger chunks reach their sink in pieces of this size: a 64 MiB chunk costs ~10% less CPU
#: than with zstd's default 128 KiB (fewer write syscalls and Python callbacks; measured in
#: ``bench/notes/i20-save.md``).
STREAM_WRITE_BYTES = 1 << 20
_INDEX = struct.Struct("<QQ")


#: Zarr data types TensorStore 0.1.86 (so Orbax) reads; ml_dtypes has a few more.
SUPPORTED_DTYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}) | frozenset(ML_FLOAT_NAMES + ML_INT_NAMES) - {"float8_e4m3", "float6_e2m3fn", "float6_e3m2fn", "uint2", "uint4"}


def storage_dtype(dtype: Any) -> np.dtype[Any]:
    """The native-order NumPy dtype a value is stored as.

    Raises ``TypeError`` for types TensorStore (and so Orbax) cannot store: structured and
    raw types, strings, objects, and ml_dtypes' ``uint2``/``uint4``/``float6_*``/``float8_e4m3``.
    """
    if isinstance(dtype, np.dtype):
        return _storage_dtype_of(dtype)  # once per dtype: 2000 leaves cost 2000 lookups, not parses
    return _storage_dtype(dtype)


@functools.lru_cache(maxsize=256)
def _storage_dtype_of(dtype: np.dtype[Any]) -> np.dtype[Any]:
    return _storage_dtype(dtype)


def _storage_dtype(dtype: Any) -> np.dtype[Any]:
    try:
        dt = data_type_from_numpy(np.dtype(dtype))
    except Exception as e:  # noqa: BLE001 - zarr3's MetadataError or numpy's TypeError
        raise TypeError(f"dtype {dtype} cannot be stored in a checkpoint") from e
    if dt.name not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype {dt.name} cannot be stored in a checkpoint (TensorStore/Orbax cannot read it)")
    return dt.dtype


@functools.lru_cache(maxsize=4096)
def zarr_metadata(
    shape: tuple[int, ...], dtype: np.dtype[Any], chunk_shape: tuple[int, ...], zarr_format: int, compression: bool,
    level: int | None = None,
    checksum: bool = False,
) -> bytes:
    """``.zarray`` / ``zarr.json`` bytes as TensorStore writes them for Orbax (``level``: a zstd
    level other than Orbax's 1 (v2) / 3 (v3))."""

    dt = data_type_from_numpy(dtype)
    meta: ArrayMetadataV2 | ArrayMetadataV3
    if zarr_format == 2:
        zstd = {"id": "zstd", "level": 1 if level is None else level}
        comp = compressor_from_v2(zstd, dt.itemsize) if compression else None
        meta = ArrayMetadataV2(
            shape=shape, data_type=dt, chunk_shape=chunk_shape, fill_value=None, compressor=comp,
            dtype_string=v2_dtype_string(dt),
        )
    else:
        inner: list[Any] = [BytesCodec()]
        if compression:
            inner.append(ZstdCodec(level=3 if level is None else level, checksum=False))
        if checksum:
            inner.append(Crc32cCodec())
        meta = ArrayMetadataV3(
            shape=shape, data_type=dt, chunk_shape=chunk_shape, fill_value=default_fill_value(dt),
            codecs=[ShardingCodec(chunk_shape, inner, None, "end")],
        )
    return meta.to_bytes()


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """How one param is stored: global shape, storage dtype, write and chunk shapes."""

    param: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    write_shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    zarr_format: int = 2
    compression: bool = True
    level: int | None = None  #: zstd level (``None``: Orbax's, 1 for Zarr v2 and 3 for v3)
    checksum: bool = False

    @property
    def metadata_key(self) -> str:
        """OCDBT key of the Zarr metadata."""
        return f"{self.param}/{'.zarray' if self.zarr_format == 2 else 'zarr.json'}"

    def metadata_bytes(self) -> bytes:
        """The Zarr metadata document."""
        return zarr_metadata(self.shape, self.dtype, self.chunk_shape, self.zarr_format, self.compression,
                             self.level, self.checksum)

    def chunk_key(self, coords: Sequence[int]) -> str:
        """OCDBT key of the chunk at grid position ``coords``."""
        if self.zarr_format == 2:
            return f"{self.param}/{'.'.join(map(str, coords)) if coords else '0'}"
        return f"{self.param}/c" + "".join(f"/{c}" for c in coords)

    @property
    def zstd_level(self) -> int | None:
        """zstd level of the chunks (``None``: uncompressed)."""
        if not self.compression:
            return None
        if self.level is not None:
            return self.level
        return 1 if self.zarr_format == 2 else 3


def chunk_regions(
    spec: ArraySpec, origin: Sequence[int], data_shape: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """``(chunk grid coords, slices into the region)`` of every chunk the region covers.

    The region starts at ``origin`` (global coordinates) and has shape ``data_shape``; it must
    start on chunk boundaries (shards and replica slices always do).
    """
    cs = spec.chunk_shape
    if all(0 < n <= c and not o % c for o, n, c in zip(origin, data_shape, cs)):  # one chunk (most leaves)
        yield tuple(o // c for o, c in zip(origin, cs)), tuple(slice(0, n) for n in data_shape)
        return
    ranges: list[list[tuple[int, slice]]] = []
    for d, (o, n, c) in enumerate(zip(origin, data_shape, cs)):
        if o % c:
            raise ValueError(f"region of {spec.param!r} starts at {o} on axis {d}, not a multiple of the chunk {c}")
        axis = []
        for start in range(0, max(n, 0), c):
            axis.append(((o + start) // c, slice(start, min(start + c, n))))
        ranges.append(axis)
    for combo in itertools.product(*ranges):
        yield tuple(c for c, _ in combo), tuple(s for _, s in combo)


def _chunk_bytes(spec: ArraySpec, view: np.ndarray) -> memoryview:
    """The chunk's C-order little-endian bytes (padded to the full chunk at array edges)."""
    if view.dtype.byteorder == ">":
        view = view.astype(view.dtype.newbyteorder("<"))
    if view.dtype != spec.dtype:
        view = view.astype(spec.dtype) if view.dtype.kind != "V" else view.view(spec.dtype)
    if view.shape != spec.chunk_shape:
        full = np.zeros(spec.chunk_shape, dtype=spec.dtype)
        full[tuple(slice(0, s) for s in view.shape)] = view
        view = full
    elif not view.flags.c_contiguous:
        view = np.ascontiguousarray(view)
    return memoryview(view.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


class Compressors:
    """One zstd compressor per thread and level (compressors are not thread-safe)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, level: int, checksum: bool = False) -> Any:
        """This thread's compressor for ``level`` (writing frame checksums or not)."""

        cache = getattr(self._local, "c", None)
        if cache is None:
            cache = self._local.c = {}
        c = cache.get((level, checksum))
        if c is None:
            c = cache[(level, checksum)] = zstandard.ZstdCompressor(level=level, write_checksum=checksum)
        return c


class ChunkSink(Protocol):
    """Where :func:`encode_chunk` streams one stored value (an OCDBT ``ValueSink``, or a
    file of the per-parameter layout)."""

    def write(self, data: bytes | memoryview) -> int:
        """Append ``data``."""

    def finish(self) -> StoredValue:
        """Complete the value; what the caller records for it."""


class _Counting:
    """Passes writes to a :class:`ChunkSink`, counting bytes (zstd's ``stream_writer`` target)."""

    __slots__ = ("sink", "n", "crc")

    def __init__(self, sink: ChunkSink, crc: bool = False):
        self.sink = sink
        self.n = 0
        #: running CRC-32C of what was written (``None``: not computed)
        self.crc: int | None = 0 if crc else None

    def write(self, data: bytes) -> int:
        self.n += len(data)
        if self.crc is not None:
            self.crc = _crc32c_update(data, self.crc)
        return self.sink.write(data)

    def flush(self) -> None:
        pass


def encode_chunk(spec: ArraySpec, view: np.ndarray, sink: ChunkSink, compressors: Compressors) -> StoredValue:
    """Encode one chunk into ``sink``; returns what the leaf entry stores."""
    raw = _chunk_bytes(spec, view)
    level = spec.zstd_level
    trailer = spec.checksum and spec.zarr_format == 3  # the crc32c codec after zstd
    crc = 0
    if level is None:
        sink.write(raw)
        inner = raw.nbytes
        if trailer:
            crc = _crc32c_update(raw, 0)
    elif raw.nbytes <= ONE_SHOT_BYTES:
        comp = compressors.get(level, spec.checksum and not trailer).compress(raw)
        sink.write(comp)
        inner = len(comp)
        if trailer:
            crc = _crc32c_update(comp, 0)
    else:
        counter = _Counting(sink, trailer)
        frame_checksum = spec.checksum and not trailer
        with compressors.get(level, frame_checksum).stream_writer(counter, size=raw.nbytes, closefd=False,
                                                                  write_size=STREAM_WRITE_BYTES) as w:
            w.write(raw)
        inner = counter.n
        crc = counter.crc or 0
    if trailer:
        sink.write(crc.to_bytes(4, "little"))
        inner += 4
    if spec.zarr_format == 3:
        index = _INDEX.pack(0, inner)
        sink.write(index + crc32c(index).to_bytes(4, "little"))
    return sink.finish()


def encode_small(spec: ArraySpec, view: np.ndarray, compressors: Compressors) -> bytes:
    """The stored value of a small chunk (at most :data:`ONE_SHOT_BYTES`), encoded in memory."""
    raw = _chunk_bytes(spec, view)
    level = spec.zstd_level
    v3_crc = spec.checksum and spec.zarr_format == 3
    inner = raw.tobytes() if level is None else compressors.get(level, spec.checksum and not v3_crc).compress(raw)
    return _v3_shard(inner, v3_crc) if spec.zarr_format == 3 else inner


def encode_small_batch(items: Sequence[tuple[ArraySpec, np.ndarray]], compressors: Compressors) -> list[bytes]:
    """The stored values of several small chunks (each at most :data:`ONE_SHOT_BYTES`), as
    :func:`encode_small` gives them one by one.  Chunks sharing the zstd settings are
    compressed by one ``multi_compress_to_buffer`` call (the same frames as one ``compress``
    each, verified by tests), which holds the GIL once per batch instead of once per chunk."""
    if len(items) < 2:
        return [encode_small(spec, view, compressors) for spec, view in items]
    spec0 = items[0][0]
    level = spec0.zstd_level
    v3_crc = spec0.checksum and spec0.zarr_format == 3
    same = all(s.zstd_level == level and s.checksum == spec0.checksum and s.zarr_format == spec0.zarr_format
               for s, _ in items)
    if level is None or not same:
        return [encode_small(spec, view, compressors) for spec, view in items]
    raws = [_chunk_bytes(spec, view) for spec, view in items]
    if any(not r.nbytes for r in raws):
        return [encode_small(spec, view, compressors) for spec, view in items]
    coll = compressors.get(level, spec0.checksum and not v3_crc).multi_compress_to_buffer(raws, threads=1)
    out = [coll[i].tobytes() for i in range(len(raws))]
    if spec0.zarr_format == 3:
        out = [_v3_shard(inner, v3_crc) for inner in out]
    return out


def _v3_shard(inner: bytes, v3_crc: bool) -> bytes:
    """A one-chunk shard around the encoded chunk ``inner`` (crc32c codec trailer if ``v3_crc``)."""
    if v3_crc:
        inner += crc32c(inner).to_bytes(4, "little")
    index = _INDEX.pack(0, len(inner))
    return b"".join((inner, index, crc32c(index).to_bytes(4, "little")))


def _crc32c_update(data: Any, crc: int) -> int:
    return int(_crc32c_mod.crc32c(data, crc))


def nbytes_of(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    """Bytes of an array of ``shape`` and ``dtype``."""
    return math.prod(shape) * dtype.itemsize
