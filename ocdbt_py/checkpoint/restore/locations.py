"""Where every value of an OCDBT database is, from one scan of its B+tree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.keys import validate_key

__all__ = ["Location", "scan_locations"]


class Location:
    """Where one value is: ``inline`` bytes (``file`` is ``None``), or ``length`` bytes at
    ``offset`` of ``file`` (a data file key of store number ``store`` for remote reads, or a
    local path for local reads)."""

    __slots__ = ("store", "file", "offset", "length", "inline")

    def __init__(self, store: int, file: str | None, offset: int, length: int, inline: bytes | None = None):
        self.store = store
        self.file = file
        self.offset = offset
        self.length = length
        self.inline = inline


def scan_locations(db: Any, where: str) -> Iterator[tuple[str, str | None, int, int, bytes | None]]:
    """``(key, data file, offset, length, inline)`` for every entry of ``db`` (an
    :class:`~ocdbt_py.OcdbtStore`): inline values have no data file; data file paths are
    checked to be safe relative keys (``where`` names the database in the error).

    Reads the B+tree a leaf at a time as columns (no entry object, no reference object per
    value); each distinct data file is checked once."""
    checked: dict[bytes, str] = {}
    for cols in db.entry_columns():
        files, fidx, offsets, lengths = cols.locations()
        paths = []
        for f in files:
            fk = f.path
            path = checked.get(fk)
            if path is None:
                try:
                    path = fk.decode("utf-8")
                    validate_key(path)
                except (UnicodeDecodeError, ValueError) as err:
                    raise CorruptionError(f"unsafe data file path {fk!r}: {err}", path=where) from err
                checked[fk] = path
            paths.append(path)
        inline_at = [i for i, f in enumerate(fidx) if f < 0]
        inline = dict(zip(inline_at, cols.inline(inline_at))) if inline_at else {}
        for i, (k, f, off, n) in enumerate(zip(cols.keys, fidx, offsets, lengths)):
            key = k.decode("utf-8", "surrogateescape")
            if f < 0:
                yield key, None, 0, n, inline[i] or b""
            else:
                yield key, paths[f], off, n, None
