"""How a source array is stored, how its copy will be, and how each chunk gets there.

Three ways to move a chunk, cheapest first:

* ``"bytes"``: the destination encodes the array exactly as the source (same Zarr version,
  chunk shape, data type and codecs): the stored value is copied as is;
* ``"rewrap"``: only the Zarr version changes, and both sides hold one compressed (or raw)
  frame per chunk: the frame is kept and only its wrapping changes (a Zarr v3 chunk is the
  frame followed by the 16-byte shard index and its CRC-32C; a Zarr v2 chunk is the frame);
* ``"transcode"``: only the compression changes (zstd level, zstd <-> none, and maybe the
  Zarr version): each frame is decompressed and compressed again as a stream;
* ``"encode"``: anything else (new chunk shape or data type): chunks are decoded and encoded
  again, a region aligned to both chunk grids at a time.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import ml_dtypes
import numpy as np
import zstandard

from ocdbt_py.checkpoint.saving.arrays import ArraySpec, storage_dtype
from ocdbt_py.checkpoint.saving.chunking import choose_chunk_shape, chunk_byte_limit
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.envelope import crc32c
from zarr3.codecs.bytes import BytesCodec
from zarr3.codecs.crc32c import Crc32cCodec
from zarr3.codecs.sharding import ShardingCodec
from zarr3.codecs.zstd import ZstdCodec

__all__ = ["SourceEncoding", "source_encoding", "target_spec", "strategy", "wrap_frame", "unwrap_frame",
           "Target", "cast_dtype"]

_INDEX = struct.Struct("<QQ")
TRAILER = _INDEX.size + 4
_MISSING = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class SourceEncoding:
    """What decides whether a source chunk can be moved without decoding it."""

    zarr_format: int
    shape: tuple[int, ...]
    chunk_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    #: ``"zstd"``, ``"none"`` or ``"other"`` (filters, other codecs, big-endian, nested shards...)
    compression: str
    level: int | None


def _little(dtype: np.dtype[Any]) -> bool:
    return dtype.itemsize == 1 or dtype.byteorder in ("<", "=") or (dtype.byteorder == "|")


def _v2_encoding(meta: Any) -> tuple[str, int | None]:
    comp = meta.compressor
    stored = meta.stored_dtype if meta.stored_dtype is not None else meta.data_type.dtype
    if meta.order != "C" or not _little(stored) or getattr(meta, "filters", None):
        return "other", None
    if comp is None:
        return "none", None
    if getattr(comp, "name", None) == "zstd" and not getattr(comp, "checksum", False):
        return "zstd", int(comp.level)
    return "other", None


def _v3_encoding(meta: Any) -> tuple[str, int | None]:
    codecs = list(meta.codecs)
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return "other", None
    sh = codecs[0]
    if tuple(sh.chunk_shape) != tuple(meta.chunk_shape) or sh.index_location != "end":
        return "other", None
    idx = list(sh.index_codecs)
    if not (len(idx) == 2 and isinstance(idx[0], BytesCodec) and idx[0].endian in ("little", None)
            and isinstance(idx[1], Crc32cCodec)):
        return "other", None
    inner = list(sh.codecs)
    if not inner or not isinstance(inner[0], BytesCodec) or (
            inner[0].endian not in ("little", None)):
        return "other", None
    if len(inner) == 1:
        return "none", None
    if len(inner) == 2 and isinstance(inner[1], ZstdCodec) and not inner[1].checksum:
        return "zstd", int(inner[1].level)
    return "other", None


def source_encoding(meta: Any) -> SourceEncoding:
    """The :class:`SourceEncoding` of parsed Zarr metadata (``zarr3`` objects)."""
    kind, level = _v2_encoding(meta) if meta.zarr_format == 2 else _v3_encoding(meta)
    return SourceEncoding(int(meta.zarr_format), tuple(meta.shape), tuple(meta.chunk_shape),
                          np.dtype(meta.data_type.dtype), kind, level)


def cast_dtype(name: str) -> np.dtype[Any]:
    """The storage dtype for ``--dtype NAME`` (``bfloat16``, ``float16``, ``float32``...)."""
    try:
        dt = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except TypeError as e:
        raise ValueError(f"unknown dtype {name!r}") from e
    if not is_float(dt):
        raise ValueError(f"--dtype casts floating-point arrays; {name!r} is not a floating-point type")
    return storage_dtype(dt)


def is_float(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is a real floating-point type (NumPy's or ml_dtypes')."""
    if dtype.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return dtype.kind == "V"


@dataclasses.dataclass(frozen=True)
class Target:
    """The destination options of a copy (``None``: as the source)."""

    zarr3: bool | None = None
    chunk_byte_size: int | None = None
    target_data_file_size: int = 2 << 30
    #: ``None``: as the source; ``0``: uncompressed; otherwise the zstd level
    compression: int | None = None
    dtype: np.dtype[Any] | None = None
    use_ocdbt: bool = True


def target_spec(param: str, src: SourceEncoding, write_shape: Sequence[int] | None, t: Target) -> ArraySpec:
    """The destination :class:`ArraySpec` of one array."""
    dtype = src.dtype
    if t.dtype is not None and is_float(src.dtype):
        dtype = t.dtype
    zarr_format = src.zarr_format if t.zarr3 is None else (3 if t.zarr3 else 2)
    ws = tuple(write_shape) if write_shape is not None and len(write_shape) == len(src.shape) else src.shape
    if any(not 0 < w <= s for w, s in zip(ws, src.shape)):
        ws = src.shape
    target = t.target_data_file_size if t.use_ocdbt else 0
    chunk = src.chunk_shape
    src_bytes = math.prod(src.chunk_shape) * dtype.itemsize
    if t.chunk_byte_size is not None or (target and src_bytes > target):
        limit = chunk_byte_limit(ws, dtype.itemsize, t.chunk_byte_size, target)
        chunk = choose_chunk_shape(src.shape, ws, dtype.itemsize, limit)
    if t.compression is None:
        compression = src.compression != "none"
        level = None
        if src.compression == "zstd" and tuple(chunk) == src.chunk_shape and dtype == src.dtype:
            level = src.level  # the frames are kept: the metadata names their level
    else:
        compression = t.compression != 0
        level = t.compression if compression else None
    return ArraySpec(param, src.shape, dtype, ws, tuple(chunk), zarr_format, compression, level)


def strategy(src: SourceEncoding, dst: ArraySpec, forced_compression: bool) -> str:
    """``"bytes"``, ``"rewrap"``, ``"transcode"`` or ``"encode"`` (module docstring)."""
    if src.compression == "other" or src.chunk_shape != dst.chunk_shape or src.dtype != dst.dtype:
        return "encode"
    same_codec = (src.compression == "none" and not dst.compression) or (
        src.compression == "zstd" and dst.compression and (not forced_compression or src.level == dst.zstd_level))
    if not same_codec:
        return "transcode"
    return "bytes" if src.zarr_format == dst.zarr_format else "rewrap"


#: Decoded bytes are produced in pieces of at most this size (never a whole chunk at once).
RAW_PIECE = 4 << 20


class _PiecesReader:
    """A ``read()``-able view of an iterator of byte pieces (zstd's ``stream_reader`` source)."""

    def __init__(self, pieces: Iterable[bytes | memoryview]):
        self._it = iter(pieces)
        self._buf = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        while not len(self._buf):
            nxt = next(self._it, None)
            if nxt is None:
                return b""
            self._buf = memoryview(nxt)
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, memoryview(b"")
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        return bytes(out)


def raw_pieces(pieces: Iterable[bytes | memoryview], compressed: bool, expected: int, *,
               piece: int = RAW_PIECE) -> Iterator[bytes | memoryview]:
    """The decoded bytes of one frame given in pieces, in pieces of at most ``piece`` bytes
    when decompressing (so a highly compressed frame never expands in memory at once); a frame
    that decodes to more or fewer than ``expected`` bytes is a :class:`CorruptionError`."""
    n = 0
    if not compressed:
        for p in pieces:
            n += len(p)
            if n > expected:
                break
            yield p
    else:
        source: Any = _PiecesReader(pieces)  # duck-typed: zstd only calls read()
        reader = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=False)
        while True:
            try:
                out = reader.read(piece)
            except zstandard.ZstdError as e:
                raise CorruptionError(f"a zstd frame of the source does not decode: {e}") from e
            if not out:
                break
            n += len(out)
            if n > expected:
                break
            yield out
    if n != expected:
        raise CorruptionError(f"a chunk of the source decodes to {'more' if n > expected else n} bytes, "
                              f"not the {expected} its array needs")


class Transcoder:
    """Streams one frame from the source codec to the destination's (zstd or none), counting
    the CRC-32C of the decoded bytes in between (:attr:`raw_crc`, once :meth:`run` is done)."""

    def __init__(self, src: SourceEncoding, dst: ArraySpec):
        self.src = src
        self.dst = dst
        self.raw_crc = 0

    def run(self, pieces: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        """Source frame pieces in, destination frame pieces out."""
        expected = math.prod(self.dst.chunk_shape) * self.dst.dtype.itemsize
        level = self.dst.zstd_level
        comp = (zstandard.ZstdCompressor(level=level, write_checksum=False).compressobj(size=expected)
                if level is not None else None)
        for raw in raw_pieces(pieces, self.src.compression == "zstd", expected):
            self.raw_crc = crc32c(raw, self.raw_crc)
            out = comp.compress(raw) if comp is not None else raw
            if len(out):
                yield out
        if comp is not None:
            yield comp.flush()


def raw_crc(frame: bytes | memoryview, compressed: bool, expected: int) -> int:
    """CRC-32C of a frame's decoded bytes (decompressed in pieces)."""
    crc = 0
    for raw in raw_pieces([frame], compressed, expected):
        crc = crc32c(raw, crc)
    return crc


@overload
def unwrap_frame(value: bytes | memoryview, zarr_format: int, where: str) -> memoryview | None: ...


@overload
def unwrap_frame(value: bytes | memoryview, zarr_format: int, where: str, *, suffix: bool
                 ) -> tuple[int, int] | None: ...


def unwrap_frame(value: bytes | memoryview, zarr_format: int, where: str, *, suffix: bool = False) -> Any:
    """The frame inside a stored chunk (``None``: a Zarr v3 chunk whose inner chunk is absent).

    ``suffix=True``: ``value`` is only the chunk's last :data:`TRAILER` bytes (the shard
    index); returns the frame's ``(start, stop)`` in the chunk instead.
    """
    mv = memoryview(value)
    if zarr_format == 2:
        return mv
    if len(mv) < TRAILER:
        raise CorruptionError(f"chunk {where}: {len(mv)} bytes is too short for a shard index", path=where)
    index = mv[len(mv) - TRAILER:len(mv) - 4]
    if crc32c(index) != int.from_bytes(mv[len(mv) - 4:], "little"):
        raise CorruptionError(f"chunk {where}: shard index checksum mismatch", path=where)
    off, n = _INDEX.unpack(index)
    if off == _MISSING and n == _MISSING:
        return None
    if suffix:
        return off, off + n
    if off + n > len(mv) - TRAILER:
        raise CorruptionError(f"chunk {where}: shard index points past the chunk", path=where)
    return mv[off:off + n]


def wrap_frame(frame: bytes | memoryview, zarr_format: int, *, length: int | None = None
               ) -> list[bytes | memoryview]:
    """The parts of a stored chunk holding ``frame`` (``length``: the frame's length when it
    is streamed separately; the second part is then the shard index to append)."""
    if zarr_format == 2:
        return [frame]
    index = _INDEX.pack(0, memoryview(frame).nbytes if length is None else length)
    return [frame, index + crc32c(index).to_bytes(4, "little")]
