"""Data file ids, indirect references, statistics, and the data file table codec."""

from __future__ import annotations

from typing import NamedTuple

from ocdbt_py.format.reader import Reader, put_varint

__all__ = [
    "DataFileId",
    "IndirectDataReference",
    "Statistics",
    "decode_data_file_table",
    "encode_data_file_table",
    "MAX_PATH_LENGTH",
]

MAX_PATH_LENGTH = 65535
_OFFSET_LIMIT = (1 << 63) - 1


class DataFileId(NamedTuple):
    """A data file, as ``(base_path, relative_path)``; its key is their concatenation.

    Tuple order is the table's sort order (base path first, then relative path).
    """

    base_path: bytes
    relative_path: bytes

    @property
    def path(self) -> bytes:
        """The file's key relative to the database root."""
        return self.base_path + self.relative_path


EMPTY_FILE_ID = DataFileId(b"", b"")


class IndirectDataReference(NamedTuple):
    """Bytes ``[offset, offset + length)`` of a data file."""

    file: DataFileId
    offset: int
    length: int

    @property
    def is_missing(self) -> bool:
        """The marker of an empty tree: the empty file id and offset/length 2**64-1."""
        return self.offset == (1 << 64) - 1 and self.length == (1 << 64) - 1


class Statistics(NamedTuple):
    """Statistics of a subtree: keys, encoded node bytes, out-of-line value bytes."""

    num_keys: int
    num_tree_bytes: int
    num_indirect_value_bytes: int


ZERO_STATS = Statistics(0, 0, 0)


def check_reference(r: Reader, offset: int, length: int, what: str, pos: int) -> None:
    """Reject a reference whose end overflows 2**63-1."""
    if offset + length > _OFFSET_LIMIT:
        raise r.error(f"{what} reference offset {offset} + length {length} overflows", pos)


def decode_data_file_table(r: Reader, transitive: bytes = b"") -> list[DataFileId]:
    """Read a data file table; base paths get ``transitive`` prepended."""
    start = r.pos
    n = r.varint(what="data file count")
    # every entry needs at least 2 bytes of columns
    if n > r.remaining():
        raise r.error(f"data file table claims {n} files but only {r.remaining()} bytes remain", start)
    max_len = MAX_PATH_LENGTH - len(transitive)
    prefix = [0] + r.varint_column(n - 1, 0xFFFFFFFF, "path prefix length") if n else []
    suffix = r.varint_column(n, 0xFFFFFFFF, "path suffix length")
    base_len = r.varint_column(n, 0xFFFFFFFF, "base path length")
    out: list[DataFileId] = []
    prev = b""
    prev_base = 0
    for i in range(n):
        p = prefix[i]
        if p > len(prev):
            raise r.error(f"data file {i}: prefix length {p} exceeds the previous path's length {len(prev)}")
        if p + suffix[i] > max_len:
            raise r.error(f"data file {i}: path length {p + suffix[i]} exceeds {max_len}")
        path = prev[:p] + r.take(suffix[i], "data file path")
        b = base_len[i]
        if b > len(path):
            raise r.error(f"data file {i}: base path length {b} exceeds the path length {len(path)}")
        if i > 0 and p > min(prev_base, b) and b != prev_base:
            raise r.error(f"data file {i}: shared path prefix crosses differing base paths")
        out.append(DataFileId(transitive + path[:b], path[b:]))
        prev = path
        prev_base = b
    return out


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def encode_data_file_table(out: bytearray, files: list[DataFileId]) -> None:
    """Append a table of ``files`` (already sorted and deduplicated) to ``out``."""
    n = len(files)
    put_varint(out, n)
    prefixes: list[int] = []
    for i in range(1, n):
        a, b = files[i - 1], files[i]
        p = _common_prefix(a.base_path, b.base_path)
        if a.base_path == b.base_path:
            p += _common_prefix(a.relative_path, b.relative_path)
        prefixes.append(p)
        put_varint(out, p)
    for i, f in enumerate(files):
        put_varint(out, len(f.path) - (prefixes[i - 1] if i else 0))
    for f in files:
        put_varint(out, len(f.base_path))
    for i, f in enumerate(files):
        out += f.path[(prefixes[i - 1] if i else 0):]
