"""Copying one array's chunks: tasks for the thread pool, and their verification.

Each task moves a bounded amount: one group of small chunks copied as bytes (up to
:data:`BATCH_BYTES`), one large chunk, or one region aligned to both chunk grids (decoded
once, encoded into every destination chunk inside it).  A region is never larger than
:data:`REGION_BYTES` unless a single chunk is; otherwise each destination chunk reads just
what it needs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ocdbt_py.checkpoint.convert.encoding import (
    RAW_PIECE,
    TRAILER,
    SourceEncoding,
    Transcoder,
    raw_crc,
    raw_pieces,
    unwrap_frame,
    wrap_frame,
)
from ocdbt_py.checkpoint.saving.arrays import ArraySpec, chunk_regions
from ocdbt_py.errors import CorruptionError
from ocdbt_py.format.envelope import crc32c
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.sinks import Sink
from ocdbt_py.pools import dedicated
from zarr3.stored import DENSE_MAX, grid_shape

__all__ = ["ArrayJob", "ItemWriter", "Stats", "array_tasks", "run_budgeted", "verify_array", "BATCH_BYTES",
           "REGION_BYTES"]

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
    chunks_transcoded: int = 0
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
    #: destination key -> (CRC-32C, Zarr format to unwrap or 0, 1 if the CRC is of the decoded
    #: bytes (transcoded) else of the frame or value itself)
    crcs: dict[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Logical size (for progress)."""
        return math.prod(self.src.shape) * self.src.dtype.itemsize


def _grid(shape: Sequence[int], chunk: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(-(-s // c)) for s, c in zip(shape, chunk)))


def _frame_pieces(job: ArrayJob, src_kv: KvStore, key: str, small: bool) -> Iterable[bytes | memoryview] | None:
    """The source chunk's bytes to move (the whole value for ``"bytes"``, else its frame):
    one read for a small chunk, range reads of :data:`BATCH_BYTES` otherwise; ``None`` when
    the source does not store the chunk (it stays absent in the copy)."""
    whole = job.how == "bytes"
    if small:
        value = src_kv.get(key)
        if value is None:
            return None
        frame = value if whole else unwrap_frame(value, job.src.zarr_format, key)
        return None if frame is None else [frame]
    if whole or job.src.zarr_format == 2:
        return None if src_kv.get(key, (0, 0)) is None else _pieces(src_kv, key, 0, None)
    tail = src_kv.get(key, (-TRAILER, None))
    rng = None if tail is None else unwrap_frame(tail, 3, key, suffix=True)
    return None if rng is None else _pieces(src_kv, key, rng[0], rng[1])


def _move_chunk(job: ArrayJob, src_kv: KvStore, writer: ItemWriter, c: tuple[int, ...], small: bool,
                lock: threading.Lock) -> int:
    """Copy, rewrap or transcode one chunk (small: in memory; else streamed); bytes read."""
    key = f"{job.param}/{job.meta.chunk_key(c)}"
    pieces = _frame_pieces(job, src_kv, key, small)
    if pieces is None:
        return 0
    dkey = key if job.how == "bytes" else job.spec.chunk_key(c)
    tc = Transcoder(job.src, job.spec) if job.how == "transcode" else None
    parts: list[bytes | memoryview] = []
    out = None if small else writer.open_value(dkey)
    emit = parts.append if out is None else out.write
    crc = size = 0
    read = [0]
    try:
        counted = _counting(pieces, read)
        for piece in (tc.run(counted) if tc is not None else counted):
            if tc is None:
                crc = crc32c(piece, crc)
            emit(piece)
            size += len(piece)
        if job.how != "bytes" and job.spec.zarr_format == 3:
            emit(wrap_frame(b"", 3, length=size)[1])
        if out is None:
            writer.put_parts(dkey, parts)
        else:
            out.close()
    except BaseException:
        if out is not None:
            out.abort()
        raise
    record = (tc.raw_crc, job.spec.zarr_format, 1) if tc is not None else (
        crc, 0 if job.how == "bytes" else job.spec.zarr_format, 0)
    with lock:
        job.crcs[dkey] = record
    return read[0]


def _counting(pieces: Iterable[bytes | memoryview], box: list[int]) -> Iterator[bytes | memoryview]:
    for p in pieces:
        box[0] += len(p)
        yield p


_COUNTER = {"bytes": "chunks_bytes", "rewrap": "chunks_rewrapped", "transcode": "chunks_transcoded"}


def _move_chunks(job: ArrayJob, src_kv: KvStore, writer: ItemWriter, coords: list[tuple[int, ...]], small: bool,
                 stats: Stats, lock: threading.Lock) -> None:
    read = sum(_move_chunk(job, src_kv, writer, c, small, lock) for c in coords)
    stats.add(bytes_read=read, **{_COUNTER[job.how]: len(coords)})


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


def _row_bytes(job: ArrayJob) -> int:
    """Bytes of one row (index along the first axis) of a source chunk."""
    return math.prod(job.src.chunk_shape[1:]) * job.src.dtype.itemsize


def _column_groups(job: ArrayJob) -> list[tuple[int, int]]:
    """Ranges along the second axis of a source chunk whose slabs (one destination chunk deep)
    fit in :data:`REGION_BYTES`; each group is one streamed pass over the source chunk."""
    src, spec = job.src, job.spec
    if len(src.chunk_shape) < 2:
        return [(0, 1)]
    width = src.chunk_shape[1]
    per_col = spec.chunk_shape[0] * math.prod(src.chunk_shape[2:]) * src.dtype.itemsize
    step = max(1, REGION_BYTES // max(1, per_col * spec.chunk_shape[1])) * spec.chunk_shape[1]
    return [(a, min(a + step, width)) for a in range(0, width, step)]


def splittable(job: ArrayJob) -> bool:
    """Whether the destination chunks of a re-encoded array are cut from each (large) source
    chunk while it is decoded as a stream: the source chunk is one zstd or raw frame larger
    than :data:`REGION_BYTES`, destination chunks tile it, and one row of it, and one
    destination chunk's column of a slab, fit in :data:`REGION_BYTES`."""
    src, spec = job.src, job.spec
    if not (job.how == "encode" and src.compression in ("zstd", "none") and src.shape):
        return False
    col = spec.chunk_shape[0] * math.prod(spec.chunk_shape[1:2]) * math.prod(src.chunk_shape[2:]) * src.dtype.itemsize
    return (all(s % d == 0 for s, d in zip(src.chunk_shape, spec.chunk_shape))
            and math.prod(src.chunk_shape) * src.dtype.itemsize > REGION_BYTES
            and _row_bytes(job) <= REGION_BYTES and col <= REGION_BYTES)


def _slabs(job: ArrayJob, src_kv: KvStore, c: tuple[int, ...], cols: tuple[int, int], read: list[int]
           ) -> Iterator[tuple[tuple[int, ...], np.ndarray]]:
    """``(global origin, values)`` of each slab of source chunk ``c``: one destination chunk
    deep along the first axis, columns ``cols`` of the second, clipped to the array; the chunk
    is decoded as a stream, a few rows at a time."""
    key = f"{job.param}/{job.meta.chunk_key(c)}"
    pieces = _frame_pieces(job, src_kv, key, small=False)
    if pieces is None:
        return  # absent in the source: absent in the copy
    src, spec = job.src, job.spec
    rows, row_bytes = spec.chunk_shape[0], _row_bytes(job)
    full = (src.chunk_shape[1],) if len(src.chunk_shape) > 1 else ()
    rest = src.chunk_shape[2:]
    sel = (slice(None), slice(*cols)) if full else (slice(None),)
    slab = np.empty((rows, cols[1] - cols[0], *rest) if full else (rows,), src.dtype)  # reused
    origin = tuple(i * n for i, n in zip(c, src.chunk_shape))
    at0 = origin if not full else (origin[0], origin[1] + cols[0], *origin[2:])
    pending = bytearray()
    fill = row0 = 0
    total = math.prod(src.chunk_shape) * src.dtype.itemsize
    for raw in raw_pieces(_counting(pieces, read), src.compression == "zstd", total, piece=RAW_PIECE):
        pending += raw
        while len(pending) >= row_bytes:
            k = min(len(pending) // row_bytes, rows - fill)
            block = np.frombuffer(pending, src.dtype, count=k * row_bytes // src.dtype.itemsize)
            slab[fill:fill + k] = block.reshape((k, *full, *rest))[sel]
            del block
            del pending[:k * row_bytes]
            fill += k
            if fill < rows:
                continue
            at = (at0[0] + row0, *at0[1:])
            fill, row0 = 0, row0 + rows
            shape: tuple[int, ...] = slab.shape
            valid = tuple(max(0, min(n, size - o)) for n, size, o in zip(shape, spec.shape, at))
            if 0 not in valid:
                yield at, slab[tuple(slice(0, v) for v in valid)]


def _split_chunk(job: ArrayJob, src_kv: KvStore, writer: ItemWriter, c: tuple[int, ...], stats: Stats) -> None:
    read = [0]
    n = 0
    for cols in _column_groups(job):
        for at, view in _slabs(job, src_kv, c, cols, read):
            for coords, inner in chunk_regions(job.spec, at, view.shape):
                writer.encode(job.spec, job.spec.chunk_key(coords), view[inner])
                n += 1
    stats.add(chunks_encoded=n, bytes_read=read[0])


def _split_cost(job: ArrayJob) -> int:
    a, b = _column_groups(job)[0]
    slab = job.spec.chunk_shape[0] * (b - a) * math.prod(job.src.chunk_shape[2:]) * job.src.dtype.itemsize
    return slab + 2 * RAW_PIECE + _row_bytes(job)


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
                ) -> Iterator[tuple[int, Callable[[], None]]]:
    """``(memory cost, task)`` copying every chunk of ``job`` (each bounded, see the module
    docstring)."""
    lock = threading.Lock()
    if splittable(job):
        cost = _split_cost(job)
        for c in _grid(job.src.shape, job.src.chunk_shape):
            yield cost, functools.partial(_split_chunk, job, src_kv, writer, tuple(c), stats)
        return
    if job.how == "encode":
        for origin, sl in regions(job):
            n = math.prod(x.stop - x.start for x in sl) if sl else 1
            cost = n * (job.src.dtype.itemsize + job.spec.dtype.itemsize)
            yield cost, functools.partial(_encode_region, job, reader, writer, origin, sl, stats)
        return
    chunk_bytes = max(1, math.prod(job.src.chunk_shape) * job.src.dtype.itemsize)
    grid: Iterable[tuple[int, ...]]
    if math.prod(grid_shape(job.src.shape, job.src.chunk_shape)) > DENSE_MAX:
        # a large declared grid: the chunks the source stores (one listing), not a probe per
        # declared chunk; an absent chunk stays absent in the copy either way
        grid = reader.stored(job.param, job.meta)
    else:
        grid = _grid(job.src.shape, job.src.chunk_shape) if job.src.shape else iter([()])
    if chunk_bytes > BATCH_BYTES:
        cost = BATCH_BYTES * (3 if job.how == "transcode" else 1)
        for c in grid:
            yield cost, functools.partial(_move_chunks, job, src_kv, writer, [tuple(c)], False, stats, lock)
        return
    per_task = max(1, BATCH_BYTES // chunk_bytes)
    batch: list[tuple[int, ...]] = []
    for c in grid:
        batch.append(tuple(c))
        if len(batch) >= per_task:
            yield len(batch) * chunk_bytes, functools.partial(_move_chunks, job, src_kv, writer, batch, True,
                                                              stats, lock)
            batch = []
    if batch:
        yield len(batch) * chunk_bytes, functools.partial(_move_chunks, job, src_kv, writer, batch, True, stats, lock)


def run_budgeted(tasks: Iterable[tuple[int, Callable[[], None]]], workers: int, budget: int) -> None:
    """Run tasks on ``workers`` threads while the memory costs of those in flight stay within
    ``budget`` (a task costlier than the budget runs alone); the first error is raised."""
    with dedicated("save", max(1, workers), name="cp") as ex:
        pending: dict[concurrent.futures.Future[None], int] = {}
        used = 0
        try:
            for cost, fn in tasks:
                while pending and (used + cost > budget or len(pending) >= 2 * workers):
                    done, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    for f in done:
                        used -= pending.pop(f)
                        f.result()
                pending[ex.submit(fn)] = cost
                used += cost
            for f in concurrent.futures.as_completed(list(pending)):
                f.result()
        except BaseException:
            for f in pending:
                f.cancel()
            raise


def verify_array(job: ArrayJob, src_reader: Any, dst_reader: Any, dst_kv: KvStore,
                 src_kv: KvStore | None = None) -> None:
    """Compare the copy with the source: CRCs of chunks moved as bytes (re-read from the
    destination), every value of re-encoded arrays (region by region, or slab by slab of each
    large source chunk decoded as a stream)."""
    if splittable(job) and src_kv is not None:
        for c in _grid(job.src.shape, job.src.chunk_shape):
            for cols in _column_groups(job):
                for at, view in _slabs(job, src_kv, c, cols, [0]):
                    sl = tuple(slice(o, o + n) for o, n in zip(at, view.shape))
                    b = dst_reader.read(job.param, sl)
                    if b.dtype != job.spec.dtype or view.astype(job.spec.dtype).tobytes() != b.tobytes():
                        raise CorruptionError(f"verify: array {job.param!r} differs from the source in {sl}",
                                              path=dst_kv.url)
        return
    if job.how != "encode":
        for key, (crc, fmt, raw) in job.crcs.items():
            value = dst_kv.get(key)
            if value is None:
                raise CorruptionError(f"verify: {key!r} is missing from the copy", path=dst_kv.url)
            frame = value if fmt == 0 else unwrap_frame(value, fmt, key)
            expected = math.prod(job.spec.chunk_shape) * job.spec.dtype.itemsize
            got = None if frame is None else raw_crc(frame, job.spec.compression, expected) if raw else crc32c(frame)
            if got != crc:
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
