"""The per-parameter layout (Orbax's ``use_ocdbt=False``): every array in its own directory.

Each param's Zarr metadata and chunks are plain files below the item directory,
``<item>/<param>/.zarray`` and ``<item>/<param>/0.0`` (Zarr v2) or ``<param>/zarr.json`` and
``<param>/c/0/0`` (Zarr v3), with the keys, metadata and chunk bytes an OCDBT save would store.
Every process writes the chunks of its own shards straight into the (temporary) item
directory; there is nothing to merge.  Chunk tasks run on a thread pool, a bounded number in
flight; large chunks are compressed as a stream into their file.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ocdbt_py.checkpoint.saving.arrays import (
    ONE_SHOT_BYTES,
    ArraySpec,
    Compressors,
    encode_chunk,
    encode_small,
)
from ocdbt_py.checkpoint.saving.merge import IncompleteSaveError
from ocdbt_py.checkpoint.saving.process_writer import ChunkJob, chunk_tasks, run_bounded
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.sinks import Sink, open_sink

__all__ = ["DirWriter", "check_files_complete"]


class _FileValue:
    """A :class:`~ocdbt_py.checkpoint.saving.arrays.ChunkSink` writing one file."""

    __slots__ = ("sink", "n")

    def __init__(self, sink: Sink):
        self.sink = sink
        self.n = 0

    def write(self, data: bytes | memoryview) -> int:
        n = self.sink.write(data)
        self.n += n
        return n

    def finish(self) -> bytes:
        self.sink.close()
        return b""


class _FileStream:
    """One file of a :class:`DirWriter` written in pieces."""

    def __init__(self, writer: DirWriter, key: str):
        self.writer = writer
        self.key = key
        self.sink = open_sink(writer.kv, key, sync=writer.sync)
        self.n = 0

    def write(self, data: bytes | memoryview) -> int:
        n = self.sink.write(data)
        self.n += n
        return n

    def close(self) -> None:
        self.sink.close()
        self.writer._note(self.key, self.n)

    def abort(self) -> None:
        self.sink.abort()


class DirWriter:
    """Writes this process's keys of one item as files below ``item_kv``.

    ``written`` maps every key written to its length (for the summary and the final check).
    """

    def __init__(self, item_kv: KvStore, *, sync: bool = True):
        self.kv = item_kv
        self.sync = sync
        self.written: dict[str, int] = {}
        self._lock = threading.Lock()
        self._compressors = Compressors()

    def _note(self, key: str, n: int) -> None:
        with self._lock:
            if key in self.written:
                raise ValueError(f"key {key!r} would be written twice (overlapping regions?)")
            self.written[key] = n

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write a value already in memory (metadata, a chunk copied as bytes)."""
        self.kv.set(key, data)
        self._note(key, memoryview(data).nbytes)

    def put_parts(self, key: str, parts: Sequence[bytes | memoryview]) -> None:
        """Write a value given in pieces."""
        self.kv.set_parts(key, parts)
        self._note(key, sum(memoryview(p).nbytes for p in parts))

    def open_value(self, key: str) -> _FileStream:
        """A streaming writer for one value (``write`` pieces, then ``close``; ``abort`` on failure)."""
        return _FileStream(self, key)

    def encode(self, spec: ArraySpec, key: str, view: np.ndarray) -> None:
        """Encode one chunk into its file."""
        if view.nbytes <= ONE_SHOT_BYTES:
            self.put(key, encode_small(spec, view, self._compressors))
            return
        sink = open_sink(self.kv, key, sync=self.sync)
        out = _FileValue(sink)
        try:
            encode_chunk(spec, view, out, self._compressors)
        except BaseException:
            sink.abort()
            raise
        self._note(key, out.n)

    def tasks(self, jobs: Iterable[ChunkJob]) -> Iterable[Callable[[], None]]:
        """Tasks writing every chunk of every region (see :func:`process_writer.chunk_tasks`)."""
        return chunk_tasks(jobs, lambda spec, key, data: functools.partial(self.encode, spec, key, data), self._batch)

    def _batch(self, items: list[tuple[ArraySpec, str, np.ndarray]]) -> Callable[[], None]:
        def run() -> None:
            for spec, key, view in items:
                self.encode(spec, key, view)

        return run

    def run(self, tasks: Iterable[Callable[[], None]], workers: int, *, nice: int = 0) -> None:
        """Run the chunk tasks on ``workers`` threads (``nice``: that much lower priority), a
        bounded number in flight."""
        run_bounded(tasks, workers, nice=nice)

    def abort(self) -> None:
        """Nothing to release: files written so far stay in the temporary directory."""

    def finish(self) -> None:
        """Nothing to finish: every file is complete when its task ends."""


def check_files_complete(item_kv: KvStore, specs: Iterable[ArraySpec]) -> None:
    """Every array of the per-parameter layout has its metadata file and every chunk file
    (listing the item once)."""
    specs = list(specs)
    if not specs:
        return
    present = set(item_kv.list(""))
    for spec in specs:
        if spec.metadata_key not in present:
            raise IncompleteSaveError(f"array {spec.param!r} has no Zarr metadata after the save")
        grid = [range(-(-s // c)) for s, c in zip(spec.shape, spec.chunk_shape)]
        missing = [k for k in (spec.chunk_key(c) for c in itertools.product(*grid)) if k not in present]
        if missing:
            raise IncompleteSaveError(
                f"array {spec.param!r} lacks {len(missing)} chunk file(s) after the save, e.g. {missing[0]!r}")
