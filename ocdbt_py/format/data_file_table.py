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


#: Relative paths may expand (through shared prefixes) to at most this many bytes plus eight
#: times the table's own size; real tables hold short ``d/<32 hex>`` names.
_PATH_BYTES_SLACK = 1 << 20


def decode_data_file_table(r: Reader, transitive: bytes = b"") -> list[DataFileId]:
    """Read a data file table; base paths get ``transitive`` prepended.

    Consecutive entries with the same base path share one ``bytes`` object for it, and the
    relative paths' total size is bounded, so shared prefixes cannot expand a small table
    into gigabytes.
    """
    start = r.pos
    n = r.varint(what="data file count")
    # every entry needs at least 2 bytes of columns
    if n > r.remaining():
        raise r.error(f"data file table claims {n} files but only {r.remaining()} bytes remain", start)
    max_len = MAX_PATH_LENGTH - len(transitive)
    prefix = [0] + r.varint_column(n - 1, 0xFFFFFFFF, "path prefix length") if n else []
    suffix = r.varint_column(n, 0xFFFFFFFF, "path suffix length")
    base_len = r.varint_column(n, 0xFFFFFFFF, "base path length")
    budget = _PATH_BYTES_SLACK + 8 * (r.pos - start + sum(suffix))
    held = 0
    out: list[DataFileId] = []
    prev_raw_base = b""  # the previous path split at its base length
    prev_rel = b""
    prev_base = 0
    base = transitive
    for i in range(n):
        p = prefix[i]
        s = suffix[i]
        b = base_len[i]
        prev_len = prev_base + len(prev_rel)
        if p > prev_len:
            raise r.error(f"data file {i}: prefix length {p} exceeds the previous path's length {prev_len}")
        if p + s > max_len:
            raise r.error(f"data file {i}: path length {p + s} exceeds {max_len}")
        if b > p + s:
            raise r.error(f"data file {i}: base path length {b} exceeds the path length {p + s}")
        if i > 0 and p > min(prev_base, b) and b != prev_base:
            raise r.error(f"data file {i}: shared path prefix crosses differing base paths")
        sfx = r.take(s, "data file path")
        if i > 0 and b == prev_base and p >= b:
            # same base path: share it, and build only the relative part
            rel = prev_rel[: p - b] + sfx
        else:
            # here p <= min(prev_base, b): the shared part lies inside the previous base path
            path = prev_raw_base[:p] + sfx
            prev_raw_base = path[:b]
            base = transitive + prev_raw_base
            held += len(base)
            rel = path[b:]
        held += len(rel)
        if held > budget:
            raise r.error(f"data file paths expand to more than {budget} bytes", start)
        out.append(DataFileId(base, rel))
        prev_rel = rel
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
