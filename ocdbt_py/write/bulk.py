"""Bulk building: a single-generation OCDBT database written in one pass (checkpoint writers).

A checkpoint's per-process database and the merged root are written once and never updated,
so instead of committing through the general writer (which needs conditional writes and holds
values until commit) this module

* streams each value straight into a data file (:class:`DataFilePool`, :class:`ValueSink`):
  values of at most ``max_inline_value_bytes`` stay inline, the rest are appended to one of
  several data files (one per writing thread, closed at ``target_data_file_size``);
* then encodes the B+tree bottom-up with the writer's node encoder (TensorStore's node
  splitting) and writes the manifest holding generation 1 only (Orbax's ``assume_config``:
  no empty initial generation).

The manifest is written last, with an atomic replace: until then the directory holds only
unreferenced data files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Union

from ocdbt_py.format.btree import BtreeChild
from ocdbt_py.format.config import Config
from ocdbt_py.format.data_file_table import DataFileId, IndirectDataReference, Statistics
from ocdbt_py.format.manifest import Manifest, encode_manifest
from ocdbt_py.format.version_tree import BtreeGenerationReference
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.sinks import Sink, open_sink
from ocdbt_py.read.btree_read import iterate
from ocdbt_py.read.node_reader import NodeReader
from ocdbt_py.read.version_read import read_manifest
from ocdbt_py.write.data_writer import DataWriter
from ocdbt_py.write.node_encoder import encode_interior_level, encode_leaf_level

__all__ = [
    "DataFilePool",
    "ValueSink",
    "StoredValue",
    "write_database",
    "MANIFEST_KEY",
]

MANIFEST_KEY = "manifest.ocdbt"
#: A value in a leaf: inline bytes or where the bytes were written.
StoredValue = Union[bytes, IndirectDataReference]
_MAX_HEIGHT = 255
_WRITE_PIECE = 4 << 20


class _DataFile:
    __slots__ = ("name", "sink", "size", "file_id")

    def __init__(self, kv: KvStore, prefix: str, sync: bool):
        self.name = prefix + secrets.token_hex(16)
        self.sink: Sink = open_sink(kv, self.name, sync=sync)
        self.size = 0
        self.file_id = DataFileId(b"", self.name.encode())

    def write(self, data: bytes | memoryview) -> None:
        mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        n = mv.nbytes
        for start in range(0, n, _WRITE_PIECE):
            self.sink.write(mv[start:start + _WRITE_PIECE])
        self.size += n

    def write_parts(self, parts: Sequence[bytes]) -> None:
        """Append the concatenation of ``parts`` (one vectored write per group of parts where
        the sink has one, else joined): many small encoded chunks are never copied into one
        buffer first."""
        write_parts = getattr(self.sink, "write_parts", None)
        if write_parts is None:
            self.write(b"".join(parts))
            return
        self.size += write_parts(parts)


class DataFilePool:
    """Data files values are appended to; each is used by one thread at a time.

    A value is written between :meth:`lease` and :meth:`release` of one file, so it is
    contiguous; a file is closed once it reaches ``target_size`` (0: never).
    """

    def __init__(self, kv: KvStore, *, target_size: int = 2 << 30, prefix: str = "d/", sync: bool = True):
        self.kv = kv
        self.target_size = target_size
        self.prefix = prefix
        self.sync = sync
        self._idle: list[_DataFile] = []
        self._open: set[_DataFile] = set()
        self._lock = threading.Lock()
        self.files_written: list[str] = []
        self.bytes_written = 0

    def lease(self) -> _DataFile:
        """An open data file for this thread's exclusive use."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        f = _DataFile(self.kv, self.prefix, self.sync)
        with self._lock:
            self._open.add(f)
        return f

    def release(self, f: _DataFile) -> None:
        """Give ``f`` back (closing it when it is full)."""
        if self.target_size and f.size >= self.target_size:
            self._close(f)
            return
        with self._lock:
            self._idle.append(f)

    def discard(self, f: _DataFile) -> None:
        """Drop ``f`` after a failed write (its size no longer matches its bytes)."""
        with self._lock:
            self._open.discard(f)
            with contextlib.suppress(ValueError):
                self._idle.remove(f)
        with contextlib.suppress(Exception):
            f.sink.abort()

    def _close(self, f: _DataFile) -> None:
        with self._lock:
            self._open.discard(f)
            with contextlib.suppress(ValueError):
                self._idle.remove(f)
        f.sink.close()
        with self._lock:
            self.files_written.append(f.name)
            self.bytes_written += f.size

    def close(self) -> None:
        """Close every data file (call once all values are written)."""
        with self._lock:
            files = list(self._open)
        errors: list[BaseException] = []
        for f in files:
            try:
                self._close(f)
            except BaseException as e:  # noqa: BLE001 - close the rest, then re-raise
                errors.append(e)
        if errors:
            raise errors[0]

    def abort(self) -> None:
        """Drop every open data file (after a failure)."""
        with self._lock:
            files = list(self._open)
            self._open.clear()
            self._idle.clear()
        for f in files:
            with contextlib.suppress(Exception):
                f.sink.abort()


class ValueSink:
    """Receives one value as a stream of pieces; keeps it inline if it stays small.

    The first ``inline_limit + 1`` bytes are buffered; once the value grows past the limit a
    data file is leased and everything goes there.  :meth:`finish` returns the inline bytes
    or the reference.
    """

    __slots__ = ("pool", "limit", "_buf", "_file", "_start")

    def __init__(self, pool: DataFilePool, inline_limit: int):
        self.pool = pool
        self.limit = inline_limit
        self._buf: list[bytes] = []
        self._file: _DataFile | None = None
        self._start = 0

    @property
    def length(self) -> int:
        """Bytes received so far."""
        if self._file is not None:
            return self._file.size - self._start
        return sum(len(b) for b in self._buf)

    def write(self, data: bytes | memoryview) -> int:
        """Append ``data`` to the value."""
        n = memoryview(data).nbytes
        if not n:
            return 0
        if self._file is None:
            if self.length + n <= self.limit:
                self._buf.append(bytes(data))
                return n
            f = self.pool.lease()
            self._file = f
            self._start = f.size
            try:
                for b in self._buf:
                    f.write(b)
            except BaseException:
                self._abandon()
                raise
            self._buf = []
        try:
            self._file.write(data)
        except BaseException:
            self._abandon()
            raise
        return n

    def _abandon(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            self.pool.discard(f)  # it may hold a partial value: never reuse it

    def finish(self) -> StoredValue:
        """The value's inline bytes or its reference; the data file is returned to the pool."""
        if self._file is None:
            return b"".join(self._buf)
        f, self._file = self._file, None
        ref = IndirectDataReference(f.file_id, self._start, f.size - self._start)
        self.pool.release(f)
        return ref


def store_value(pool: DataFilePool, inline_limit: int, data: bytes | memoryview) -> StoredValue:
    """Store a value already in memory: inline if small, else appended to a data file."""
    n = memoryview(data).nbytes
    if n <= inline_limit:
        return bytes(data)
    f = pool.lease()
    start = f.size
    try:
        f.write(data)
    except BaseException:
        pool.discard(f)
        raise
    ref = IndirectDataReference(f.file_id, start, n)
    pool.release(f)
    return ref


@dataclasses.dataclass(frozen=True)
class BuiltDatabase:
    """What :func:`write_database` wrote."""

    manifest: Manifest
    num_keys: int
    node_files: list[str]


def write_database(
    kv: KvStore,
    entries: Mapping[bytes, StoredValue],
    config: Config,
    *,
    target_data_file_size: int = 2 << 30,
    commit_time_ns: int | None = None,
) -> BuiltDatabase:
    """Encode the B+tree of ``entries`` and write the manifest (generation 1 only).

    Values must already be stored (inline bytes, or references into data files relative to
    ``kv``, possibly through base paths such as ``ocdbt.process_0/``).
    """
    keys = sorted(entries)
    values = [entries[k] for k in keys]
    nodes = DataWriter(kv, "d/", target_data_file_size)
    level = encode_leaf_level(
        keys, values, zstd_level=config.compression_level,
        max_decoded_node_bytes=config.max_decoded_node_bytes, may_be_root=True, write=nodes.append,
    )
    height = 0
    while len(level) > 1:
        if height >= _MAX_HEIGHT:
            raise ValueError("maximum b+tree height exceeded")
        height += 1
        level = encode_interior_level(
            height,
            [c.key for c in level],
            [c.subtree_prefix_length for c in level],
            [BtreeChild(c.location, c.statistics) for c in level],
            zstd_level=config.compression_level,
            max_decoded_node_bytes=config.max_decoded_node_bytes,
            may_be_root=True,
            write=nodes.append,
        )
    nodes.flush()
    if level:
        root: IndirectDataReference | None = level[0].location
        stats = level[0].statistics
    else:
        root, stats, height = None, Statistics(0, 0, 0), 0
    gen = BtreeGenerationReference(1, root, height, stats, commit_time_ns or time.time_ns())
    manifest = Manifest(config, (gen,), ())
    kv.set(MANIFEST_KEY, encode_manifest(manifest))
    return BuiltDatabase(manifest, len(keys), list(nodes.files_written))


def iter_entries(kv: KvStore) -> Iterator[tuple[bytes, StoredValue]]:
    """Every ``(key, inline bytes or reference)`` of the latest version of the database in ``kv``."""
    manifest, _ = read_manifest(kv)
    if not manifest.versions:
        return
    latest = manifest.versions[-1]
    reader = NodeReader(kv, manifest.config)
    for key, value in iterate(reader, (latest.root, latest.root_height)):
        yield key, value if isinstance(value, IndirectDataReference) else bytes(value)
