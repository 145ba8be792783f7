"""One process's OCDBT database of an item: ``<item>/ocdbt.process_<i>/``.

Chunks are encoded on a thread pool (zstd and file writes release the GIL), at most two tasks
per worker in flight so memory stays bounded: large chunks are compressed as a stream straight
into a data file, small ones in batches in memory.  Each task appends to a data file leased
for its exclusive use.  When everything is written the B+tree and the manifest follow.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from ocdbt_py.checkpoint.saving.arrays import (
    ONE_SHOT_BYTES,
    ArraySpec,
    Compressors,
    chunk_regions,
    encode_chunk,
    encode_small,
    encode_small_batch,
)
from ocdbt_py.checkpoint.saving.layout_writer import orbax_config
from ocdbt_py.format.data_file_table import IndirectDataReference
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.prefixed import PrefixStore
from ocdbt_py.pools import dedicated
from ocdbt_py.write.bulk import (
    BuiltDatabase,
    DataFilePool,
    StoredValue,
    ValueSink,
    store_value,
    write_database,
)

__all__ = ["ProcessWriter", "process_dir", "default_workers", "ChunkJob", "run_bounded"]

INLINE_LIMIT = 1024
#: Chunks of at most ``ONE_SHOT_BYTES`` are encoded several to a task, up to this many raw
#: bytes or chunks per task.
BATCH_BYTES = 2 << 20
BATCH_TASKS = 256

#: ``(array spec, region origin, region data)``: a region one process writes.
ChunkJob = tuple[ArraySpec, Sequence[int], np.ndarray]


def process_dir(process_index: int | str) -> str:
    """Name of a process's database directory inside an item."""
    return f"ocdbt.process_{process_index}"


def default_workers() -> int:
    """Encoding threads: one per core, at least 4 so file writes and syncs overlap compression
    (TensorStore's file I/O concurrency is also at least 4)."""
    return max(4, min(16, os.cpu_count() or 4))


def background_workers(local: bool) -> int:
    """Encoding threads of a background (``blocking=False``) save: one per core when it writes
    local files.  More threads than cores only add GIL hand-offs, and every hand-off can keep
    the caller's thread waiting.  Measured during a background save of 304 MiB on 2 cores, a
    0.5 ms sleep of the caller overran by more than 1 ms for 96-97 ms in total with 4 threads
    and 14-38 ms with 2, and the save took as long.  Remote stores keep
    :func:`default_workers`, so that their requests overlap."""
    return max(1, min(16, os.cpu_count() or 1)) if local else default_workers()



def chunk_tasks(jobs: Iterable[ChunkJob],
                one: Callable[[ArraySpec, str, np.ndarray], Callable[[], None]],
                many: Callable[[list[tuple[ArraySpec, str, np.ndarray]]], Callable[[], None]],
                ) -> Iterator[Callable[[], None]]:
    """Tasks writing every chunk of every region: chunks over ``ONE_SHOT_BYTES`` one per task
    (``one``), smaller ones batched up to ``BATCH_BYTES`` or ``BATCH_TASKS`` (``many``)."""
    batch: list[tuple[ArraySpec, str, np.ndarray]] = []
    batch_bytes = 0
    for spec, origin, data in jobs:
        if tuple(data.shape) and any(o + n > s for o, n, s in zip(origin, data.shape, spec.shape)):
            raise ValueError(f"region of {spec.param!r} at {tuple(origin)} exceeds the array shape {spec.shape}")
        chunk_bytes = max(1, math.prod(spec.chunk_shape) * spec.dtype.itemsize)
        for coords, sl in chunk_regions(spec, origin, data.shape):
            key = spec.chunk_key(coords)
            if chunk_bytes > ONE_SHOT_BYTES:
                yield one(spec, key, data[sl])
                continue
            batch.append((spec, key, data[sl]))
            batch_bytes += chunk_bytes
            if batch_bytes >= BATCH_BYTES or len(batch) >= BATCH_TASKS:
                yield many(batch)
                batch, batch_bytes = [], 0
    if batch:
        yield many(batch)


class ProcessWriter:
    """Writes this process's keys of one item into ``ocdbt.process_<i>/``."""

    def __init__(
        self,
        item_kv: KvStore,
        process_index: int,
        *,
        target_data_file_size: int,
        sync: bool = True,
    ):
        self.kv: KvStore = PrefixStore(item_kv, process_dir(process_index))
        self.pool = DataFilePool(self.kv, target_size=target_data_file_size, sync=sync)
        self.target_data_file_size = target_data_file_size
        self.entries: dict[bytes, StoredValue] = {}
        self._lock = threading.Lock()
        self._compressors = Compressors()

    def _add(self, key: str, value: StoredValue) -> None:
        k = key.encode("utf-8")
        with self._lock:
            if k in self.entries:
                raise ValueError(f"key {key!r} would be written twice (overlapping regions?)")
            self.entries[k] = value

    def put(self, key: str, data: bytes) -> None:
        """Store a small value (Zarr metadata)."""
        self._add(key, store_value(self.pool, INLINE_LIMIT, data))

    def _chunk_task(self, spec: ArraySpec, key: str, view: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            value = encode_chunk(spec, view, ValueSink(self.pool, INLINE_LIMIT), self._compressors)
            self._add(key, value)

        return run

    def put_parts(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Store a value given in pieces (inline if small, else contiguous in a data file)."""
        sink = ValueSink(self.pool, INLINE_LIMIT)
        for p in parts:
            sink.write(p)
        self._add(key, sink.finish())

    def open_value(self, key: str) -> _ValueStream:
        """A streaming writer for one value (``write`` pieces, then ``close``; ``abort`` on failure)."""
        return _ValueStream(self, key)

    def encode(self, spec: ArraySpec, key: str, view: np.ndarray) -> None:
        """Encode one chunk now (in the calling thread)."""
        if view.nbytes <= ONE_SHOT_BYTES:
            self.put(key, encode_small(spec, view, self._compressors))
        else:
            self._chunk_task(spec, key, view)()

    def _small_batch_task(self, items: list[tuple[ArraySpec, str, np.ndarray]]) -> Callable[[], None]:
        """Encode small chunks in memory, then append the large-enough ones to one data file
        with a single lease (little per-chunk overhead for many-small-array trees)."""

        def run() -> None:
            values = encode_small_batch([(spec, view) for spec, _, view in items], self._compressors)
            encoded = [(key.encode("utf-8"), v) for (_, key, _), v in zip(items, values)]
            out: dict[bytes, StoredValue] = {k: v for k, v in encoded if len(v) <= INLINE_LIMIT}
            big = [(k, v) for k, v in encoded if len(v) > INLINE_LIMIT]
            if big:
                self._append_all(big, out)
            with self._lock:
                dup = next((k for k in out if k in self.entries), None)
                if dup is not None or len(out) != len(encoded):
                    raise ValueError(f"key {dup!r} would be written twice (overlapping regions?)")
                self.entries.update(out)

        return run

    def _append_all(self, values: list[tuple[bytes, bytes]], out: dict[bytes, StoredValue]) -> None:
        """Append encoded values to data files (one write per file), honouring the target
        file size as TensorStore does: a file is closed once it reaches the target."""
        pool = self.pool
        target = pool.target_size
        f = pool.lease()
        parts: list[bytes] = []
        pos = f.size
        try:
            for k, v in values:
                out[k] = IndirectDataReference(f.file_id, pos, len(v))
                parts.append(v)
                pos += len(v)
                if target and pos >= target:
                    f.write_parts(parts)
                    pool.release(f)
                    f = pool.lease()
                    parts, pos = [], f.size
            if parts:
                f.write_parts(parts)
        except BaseException:
            pool.discard(f)
            raise
        pool.release(f)

    def tasks(self, jobs: Iterable[ChunkJob]) -> Iterable[Callable[[], None]]:
        """Tasks encoding every chunk of every region (see :func:`chunk_tasks`)."""
        return chunk_tasks(jobs, self._chunk_task, self._small_batch_task)

    def run(self, tasks: Iterable[Callable[[], None]], workers: int, *, nice: int = 0) -> None:
        """Run the chunk tasks on ``workers`` threads (``nice``: that much lower priority), a
        bounded number in flight."""
        try:
            run_bounded(tasks, workers, nice=nice)
        except BaseException:
            self.pool.abort()
            raise

    def abort(self) -> None:
        """Drop the open data files after a failure."""
        self.pool.abort()

    def finish(self) -> BuiltDatabase | None:
        """Close the data files and write the database (``None`` when nothing was written)."""
        self.pool.close()
        if not self.entries:
            return None
        return write_database(self.kv, self.entries, orbax_config(),
                              target_data_file_size=self.target_data_file_size)


class _ValueStream:
    """One value of a :class:`ProcessWriter` written in pieces (contiguous in a data file)."""

    def __init__(self, writer: ProcessWriter, key: str):
        self.writer = writer
        self.key = key
        self.sink = ValueSink(writer.pool, INLINE_LIMIT)

    def write(self, data: bytes | memoryview) -> int:
        return self.sink.write(data)

    def close(self) -> None:
        self.writer._add(self.key, self.sink.finish())

    def abort(self) -> None:
        self.sink._abandon()


def run_bounded(tasks: Iterable[Callable[[], None]], workers: int, *, nice: int = 0) -> None:
    """Run ``tasks`` on ``workers`` threads (``nice``: that much lower priority), at most two
    per worker in flight; the first error is raised (pending tasks are cancelled)."""
    if workers <= 1:
        for t in tasks:
            t()
        return
    limit = workers * 2
    with dedicated("save", workers, nice=nice) as ex:
        pending: set[concurrent.futures.Future[None]] = set()
        try:
            for t in tasks:
                pending.add(ex.submit(t))
                if len(pending) >= limit:
                    done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    for f in done:
                        f.result()
            for f in concurrent.futures.as_completed(pending):
                f.result()
        except BaseException:
            for f in pending:
                f.cancel()
            raise
