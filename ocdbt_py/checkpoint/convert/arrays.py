"""Copying one array's chunks: tasks for the thread pool, and their verification.

Each task moves a bounded amount: one group of small chunks copied as bytes (up to
:data:`BATCH_BYTES`), one large chunk, or one region aligned to both chunk grids (decoded
once, encoded into every destination chunk inside it).  A region is never larger than
:data:`REGION_BYTES` unless a single chunk is; otherwise each destination chunk reads just
what it needs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ocdbt_py.checkpoint.convert.encoding import TRAILER, SourceEncoding, unwrap_frame, wrap_frame
from ocdbt_py.checkpoint.saving.arrays import ArraySpec, chunk_regions
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.envelope import crc32c
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.sinks import Sink

__all__ = ["ArrayJob", "ItemWriter", "Stats", "array_tasks", "verify_array", "BATCH_BYTES", "REGION_BYTES"]

#: Chunks copied as bytes are grouped into tasks of about this many bytes; larger chunks are
#: streamed in pieces of this size (memory per task stays about this much).
BATCH_BYTES = 4 << 20
#: Largest region decoded at once when chunk shapes change (unless one chunk is larger).
REGION_BYTES = 32 << 20


class ItemWriter(Protocol):
    """Where an item's values go (``ProcessWriter`` for OCDBT, ``DirWriter`` for files)."""

    def put(self, key: str, data: bytes) -> None:
        """Store one value."""

    def put_parts(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Store one value given in pieces."""

    def encode(self, spec: ArraySpec, key: str, view: np.ndarray) -> None:
        """Encode and store one chunk."""

    def open_value(self, key: str) -> Sink:
        """A streaming writer for one value."""


@dataclasses.dataclass
class Stats:
    """Counters of a copy (thread-safe :meth:`add`)."""

    arrays: int = 0
    arrays_resumed: int = 0
    chunks_bytes: int = 0
    chunks_rewrapped: int = 0
    chunks_encoded: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    logical_bytes: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, **kw: int) -> None:
        """Add to counters."""
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, int]:
        """The counters."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lock"}


@dataclasses.dataclass
class ArrayJob:
    """One array to copy."""

    param: str
    meta: Any  # the source's parsed Zarr metadata
    src: SourceEncoding
    spec: ArraySpec
    how: str  # "bytes", "rewrap" or "encode"
    #: destination key -> (CRC-32C of the copied frame or value, Zarr format to unwrap or 0)
    crcs: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Logical size (for progress)."""
        return math.prod(self.src.shape) * self.src.dtype.itemsize


def _grid(shape: Sequence[int], chunk: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(-(-s // c)) for s, c in zip(shape, chunk)))


def _copy_chunks(job: ArrayJob, src_kv: KvStore, writer: ItemWriter, coords: list[tuple[int, ...]],
                 stats: Stats, lock: threading.Lock) -> None:
    keys = [f"{job.param}/{job.meta.chunk_key(c)}" for c in coords]
    values = [src_kv.get(k) for k in keys]  # tasks run in parallel already
    read = 0
    for c, key, value in zip(coords, keys, values):
        if value is None:
            continue  # a chunk the source does not store stays absent (fill value)
        read += len(value)
        if job.how == "bytes":
            writer.put(key, value)
            crc, fmt = crc32c(value), 0
        else:
            frame = unwrap_frame(value, job.src.zarr_format, key)
            if frame is None:
                continue  # an absent inner chunk: absent in the copy too
            dkey = job.spec.chunk_key(c)
            parts = wrap_frame(frame, job.spec.zarr_format)
            writer.put_parts(dkey, parts)
            crc, fmt, key = crc32c(frame), job.spec.zarr_format, dkey
        with lock:
            job.crcs[key] = (crc, fmt)
    n = len(coords)
    stats.add(bytes_read=read,
              **({"chunks_bytes": n} if job.how == "bytes" else {"chunks_rewrapped": n}))


def _pieces(src_kv: KvStore, key: str, start: int, stop: int | None) -> Iterator[bytes]:
    """The bytes ``[start, stop)`` of a value (``stop=None``: to its end) in reads of at most
    :data:`BATCH_BYTES`."""
    pos = start
    while stop is None or pos < stop:
        end = pos + BATCH_BYTES if stop is None else min(stop, pos + BATCH_BYTES)
        data = src_kv.get(key, (pos, end))
        if data is None:
            raise CorruptionError(f"chunk {key!r} vanished while it was copied", path=src_kv.url)
        if data:
            yield data
        short = len(data) < end - pos
        pos += len(data)
        if short:  # the end of the value
            if stop is not None:
                raise CorruptionError(f"chunk {key!r} is shorter than its shard index says", path=src_kv.url)
            return


def _stream_chunk(job: ArrayJob, src_kv: KvStore, writer: ItemWriter, c: tuple[int, ...], stats: Stats,
                  lock: threading.Lock) -> None:
    """Copy one large chunk in pieces (bytes or rewrapped), never whole in memory."""
    key = f"{job.param}/{job.meta.chunk_key(c)}"
    if job.how == "bytes" or job.src.zarr_format == 2:
        start, stop = 0, None
        if src_kv.get(key, (0, 0)) is None:
            return  # absent in the source: absent in the copy
    else:
        tail = src_kv.get(key, (-TRAILER, None))
        if tail is None:
            return
        frame = unwrap_frame(tail, 3, key, suffix=True)
        if frame is None:
            return
        start, stop = frame
    dkey = key if job.how == "bytes" else job.spec.chunk_key(c)
    out = writer.open_value(dkey)
    crc = n = 0
    try:
        for piece in _pieces(src_kv, key, start, stop):
            out.write(piece)
            crc = crc32c(piece, crc)
            n += len(piece)
        if job.how == "rewrap" and job.spec.zarr_format == 3:
            out.write(wrap_frame(b"", 3, length=n)[1])
        out.close()
    except BaseException:
        out.abort()
        raise
    with lock:
        job.crcs[dkey] = (crc, 0 if job.how == "bytes" else job.spec.zarr_format)
    stats.add(bytes_read=n, **({"chunks_bytes": 1} if job.how == "bytes" else {"chunks_rewrapped": 1}))


def _region_shape(src: SourceEncoding, spec: ArraySpec) -> tuple[int, ...]:
    """A region aligned to both grids (the least common multiple of the chunks), or the
    destination chunk when that would be too large."""
    region = []
    for s, d, n in zip(src.chunk_shape, spec.chunk_shape, spec.shape):
        full = -(-n // d) * d
        region.append(min(s * d // math.gcd(s, d), full))
    nbytes = math.prod(min(r, n) for r, n in zip(region, spec.shape)) * max(src.dtype.itemsize, spec.dtype.itemsize)
    chunk_bytes = math.prod(spec.chunk_shape) * spec.dtype.itemsize
    if nbytes > max(REGION_BYTES, chunk_bytes):
        return tuple(spec.chunk_shape)
    return tuple(region)


def regions(job: ArrayJob) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """``(origin, global slices)`` of the regions an encoded copy works in."""
    shape = job.spec.shape
    if not shape:
        yield (), ()
        return
    region = _region_shape(job.src, job.spec)
    for g in _grid(shape, region):
        origin = tuple(i * r for i, r in zip(g, region))
        yield origin, tuple(slice(o, min(o + r, n)) for o, r, n in zip(origin, region, shape))


def _encode_region(job: ArrayJob, reader: Any, writer: ItemWriter, origin: tuple[int, ...],
                   sl: tuple[slice, ...], stats: Stats) -> None:
    data = reader.read(job.param, sl if sl else Ellipsis)
    n = 0
    for coords, inner in chunk_regions(job.spec, origin, data.shape):
        writer.encode(job.spec, job.spec.chunk_key(coords), data[inner])
        n += 1
    stats.add(chunks_encoded=n, bytes_read=data.nbytes)


def array_tasks(job: ArrayJob, reader: Any, src_kv: KvStore, writer: ItemWriter, stats: Stats,
                ) -> Iterator[Callable[[], None]]:
    """Tasks copying every chunk of ``job`` (each bounded, see the module docstring)."""
    lock = threading.Lock()
    if job.how == "encode":
        for origin, sl in regions(job):
            yield functools.partial(_encode_region, job, reader, writer, origin, sl, stats)
        return
    chunk_bytes = max(1, math.prod(job.src.chunk_shape) * job.src.dtype.itemsize)
    if chunk_bytes > BATCH_BYTES:
        for c in _grid(job.src.shape, job.src.chunk_shape):
            yield functools.partial(_stream_chunk, job, src_kv, writer, tuple(c), stats, lock)
        return
    per_task = max(1, BATCH_BYTES // chunk_bytes)
    batch: list[tuple[int, ...]] = []
    for c in _grid(job.src.shape, job.src.chunk_shape) if job.src.shape else [()]:
        batch.append(tuple(c))
        if len(batch) >= per_task:
            yield functools.partial(_copy_chunks, job, src_kv, writer, batch, stats, lock)
            batch = []
    if batch:
        yield functools.partial(_copy_chunks, job, src_kv, writer, batch, stats, lock)


def verify_array(job: ArrayJob, src_reader: Any, dst_reader: Any, dst_kv: KvStore) -> None:
    """Compare the copy with the source: CRCs of chunks moved as bytes (re-read from the
    destination), every value of re-encoded arrays (region by region)."""
    if job.how != "encode":
        for key, (crc, fmt) in job.crcs.items():
            value = dst_kv.get(key)
            if value is None:
                raise CorruptionError(f"verify: {key!r} is missing from the copy", path=dst_kv.url)
            frame = value if fmt == 0 else unwrap_frame(value, fmt, key)
            if frame is None or crc32c(frame) != crc:
                raise CorruptionError(f"verify: {key!r} differs from the source (CRC-32C)", path=dst_kv.url)
        return
    for _, sl in regions(job):
        sel = sl if sl else Ellipsis
        a = src_reader.read(job.param, sel)
        b = dst_reader.read(job.param, sel)
        if a.dtype != job.spec.dtype:
            a = a.astype(job.spec.dtype)
        if a.shape != b.shape or b.dtype != job.spec.dtype or a.tobytes() != b.tobytes():
            raise CorruptionError(f"verify: array {job.param!r} differs from the source in {sl}", path=dst_kv.url)
