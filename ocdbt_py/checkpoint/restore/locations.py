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
    checked to be safe relative keys (``where`` names the database in the error)."""
    files: dict[bytes, str] = {}
    for e in db.entries():
        k = e.key.decode("utf-8", "surrogateescape")
        ref = e.location
        if ref is None:
            yield k, None, 0, e.size, e.inline if e.inline is not None else b""
            continue
        fk = ref.file.path
        path = files.get(fk)
        if path is None:
            try:
                path = fk.decode("utf-8")
                validate_key(path)
            except (UnicodeDecodeError, ValueError) as err:
                raise CorruptionError(f"unsafe data file path {fk!r}: {err}", path=where) from err
            files[fk] = path
        yield k, path, ref.offset, ref.length, None
