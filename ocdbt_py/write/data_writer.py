"""Packing out-of-line values and encoded nodes into immutable data files.

Follows TensorStore's ``IndirectDataWriter``: blobs are appended to an in-memory buffer that
belongs to one randomly named file; a blob's offset is the buffer size when it was appended.
The buffer becomes a file when the commit flushes, or as soon as it reaches
``target_data_file_size``.  A flushed buffer larger than 4 MiB is zero-padded to a multiple of
4096 bytes.  Empty blobs get the reference ``("", "")``, offset 0, length 0 and no file.

Buffers hold references to the caller's byte objects (no copy); files are written from the
list of parts, so a 2 GiB value is never joined into a second 2 GiB buffer.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Union

from ocdbt_py.format.data_file_table import EMPTY_FILE_ID, DataFileId, IndirectDataReference
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.keys import validate_key

__all__ = ["DataWriter", "DataWriters", "Blob", "blob_length", "PADDING_THRESHOLD", "PADDING_ALIGNMENT"]

#: Flushed buffers larger than this are padded (TensorStore: for direct-I/O reads).
PADDING_THRESHOLD = 4 << 20
PADDING_ALIGNMENT = 4096

#: Blobs up to this size are copied into a shared buffer of up to ``_SMALL_BUFFER`` bytes.
_SMALL_BLOB = 64 << 10
_SMALL_BUFFER = 4 << 20

#: A blob to store: one buffer, or a sequence of buffers stored back to back.
Blob = Union[bytes, memoryview, Sequence[Union[bytes, memoryview]]]


def blob_length(blob: Blob) -> int:
    """Number of bytes in ``blob``."""
    if isinstance(blob, (bytes, memoryview)):
        return memoryview(blob).nbytes
    return sum(memoryview(p).nbytes for p in blob)


def write_parts(kv: KvStore, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """Store the concatenation of ``parts`` at ``key`` without joining them when possible."""
    kv.set_parts(key, parts)


class DataWriter:
    """Appends blobs to data files named ``prefix + 32 random hex digits``."""

    def __init__(self, kv: KvStore, prefix: str, target_size: int):
        self.kv = kv
        self.prefix = prefix
        self.target_size = target_size
        self._parts: list[bytes | bytearray | memoryview] = []
        self._small = bytearray()  # consecutive small blobs, copied
        self._size = 0
        self._file: DataFileId | None = None
        #: Keys of every file this writer has written (for tests and garbage accounting).
        self.files_written: list[str] = []

    def _new_name(self) -> str:
        """Key of a new data file: the prefix and 128 random bits in hex."""
        return self.prefix + secrets.token_hex(16)

    @property
    def pending_bytes(self) -> int:
        """Bytes buffered and not yet written."""
        return self._size

    def append(self, blob: Blob) -> IndirectDataReference:
        """Buffer ``blob`` and return where it will be stored.

        Small blobs are copied into a shared buffer (few large writes instead of many small
        ones); large ones are kept by reference and written from the caller's memory.
        """
        if type(blob) is bytes:
            n = len(blob)
            if (
                0 < n <= _SMALL_BLOB and self._file is not None
                and not (self.target_size and self._size + n >= self.target_size)
            ):
                ref = IndirectDataReference(self._file, self._size, n)
                self._small += blob
                self._size += n
                if len(self._small) >= _SMALL_BUFFER:
                    self._parts.append(self._small)
                    self._small = bytearray()
                return ref
            parts: list[bytes | memoryview] = [blob]
        else:
            parts = [blob] if isinstance(blob, memoryview) else list(blob)  # type: ignore[arg-type]
            n = sum(memoryview(p).nbytes for p in parts)
        if n == 0:
            return IndirectDataReference(EMPTY_FILE_ID, 0, 0)
        if self._file is None:
            name = self._new_name()
            validate_key(name)
            self._file = DataFileId(b"", name.encode())
        ref = IndirectDataReference(self._file, self._size, n)
        if self._small:
            self._parts.append(self._small)
            self._small = bytearray()
        self._parts.extend(p for p in parts if memoryview(p).nbytes)
        self._size += n
        if self.target_size > 0 and self._size >= self.target_size:
            self.flush()
        return ref

    def append_many(self, blobs: list[bytes]) -> list[IndirectDataReference]:
        """:meth:`append` for many ``bytes`` blobs (the staging loop of a bulk commit)."""
        out: list[IndirectDataReference] = []
        new = tuple.__new__
        ref_t = IndirectDataReference
        i = 0
        n_blobs = len(blobs)
        while i < n_blobs:
            if self._file is None:
                out.append(self.append(blobs[i]))
                i += 1
                continue
            f = self._file
            small = self._small
            size = self._size
            limit = self.target_size
            while i < n_blobs:
                b = blobs[i]
                n = len(b)
                if not 0 < n <= _SMALL_BLOB or (limit and size + n >= limit) or len(small) >= _SMALL_BUFFER:
                    break
                out.append(new(ref_t, (f, size, n)))  # type: ignore[arg-type]
                small += b
                size += n
                i += 1
            self._size = size
            if i < n_blobs:
                out.append(self.append(blobs[i]))  # the general path handles this one
                i += 1
        return out

    def flush(self) -> None:
        """Write the buffered blobs (if any) as one data file."""
        if self._file is None:
            return
        if self._small:
            self._parts.append(self._small)
            self._small = bytearray()
        parts = self._parts
        size = self._size
        if size > PADDING_THRESHOLD and size % PADDING_ALIGNMENT:
            parts.append(bytes(PADDING_ALIGNMENT - size % PADDING_ALIGNMENT))
        key = self._file.relative_path.decode()
        self._parts = []
        self._size = 0
        self._file = None
        write_parts(self.kv, key, parts)
        self.files_written.append(key)

    def discard(self) -> None:
        """Drop buffered blobs without writing them."""
        self._parts = []
        self._small = bytearray()
        self._size = 0
        self._file = None


class DataWriters:
    """The value, B+tree-node and version-node writers; kinds with one prefix share a writer."""

    def __init__(
        self,
        kv: KvStore,
        *,
        value_prefix: str = "d/",
        btree_prefix: str = "d/",
        version_prefix: str = "d/",
        target_size: int = 1 << 31,
    ):
        by_prefix: dict[str, DataWriter] = {}
        for p in (value_prefix, btree_prefix, version_prefix):
            if p not in by_prefix:
                by_prefix[p] = DataWriter(kv, p, target_size)
        self.value = by_prefix[value_prefix]
        self.btree = by_prefix[btree_prefix]
        self.version = by_prefix[version_prefix]
        self._all = list(by_prefix.values())

    def flush(self) -> None:
        """Write every buffered data file."""
        for w in self._all:
            w.flush()

    def discard(self) -> None:
        """Drop everything buffered."""
        for w in self._all:
            w.discard()

    @property
    def files_written(self) -> list[str]:
        """Keys of all data files written so far."""
        return [k for w in self._all for k in w.files_written]
