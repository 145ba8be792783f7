"""Where every value of an OCDBT database is, from one scan of its B+tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.errors import CorruptionError
from ocdbt_py.kvstore.keys import validate_key

__all__ = ["Location", "LocationTable"]


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


class LocationTable(Mapping[str, Location]):
    """Every key's :class:`Location` in one or more databases (the first holding a key wins),
    kept as columns filled by one B+tree scan each; a :class:`Location` object is only built
    for a key that is looked up."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._fid: list[int] = []  # index into _files; -1: inline
        self._off: list[int] = []
        self._len: list[int] = []
        self._inline: dict[int, bytes] = {}
        self._files: list[tuple[int, str]] = []  # (store, file)
        self._dbs = 0
        self._np: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def add(self, db: Any, where: str, store: int = 0, file_of: Callable[[str], str] | None = None) -> None:
        """Add the entries of ``db`` (an :class:`~ocdbt_py.OcdbtStore`) not present yet;
        their data files are named ``file_of(data file key)`` (default: the key) in store
        number ``store``.  Data file paths must be safe relative keys (``where`` names the
        database in the error); the B+tree is read a leaf at a time as columns, and each distinct
        data file is checked once."""
        checked: dict[bytes, int] = {}
        first = self._dbs == 0
        self._dbs += 1
        index = self._index
        for cols in db.entry_columns():
            files, fidx, offsets, lengths = cols.locations()
            gmap = []
            for f in files:
                g = checked.get(f.path)
                if g is None:
                    path = _safe_path(f.path, where)
                    g = checked[f.path] = len(self._files)
                    self._files.append((store, file_of(path) if file_of is not None else path))
                gmap.append(g)
            gmap.append(-1)  # fidx -1 (inline) picks this
            base = len(self._fid)
            fa = np.asarray(fidx, np.int64)
            self._fid.extend(np.asarray(gmap, np.int64)[fa].tolist())
            self._off.extend(offsets)
            self._len.extend(lengths)
            inline_at = np.flatnonzero(fa < 0).tolist()
            if inline_at:
                for i, v in zip(inline_at, cols.inline(inline_at)):
                    self._inline[base + i] = v or b""
            keys = _decode_keys(cols.keys)
            if first:  # keys of one database are distinct
                index.update(zip(keys, range(base, base + len(keys))))
            else:
                for j, k in enumerate(keys, base):
                    if k not in index:
                        index[k] = j

    def get(self, key: str, default: Any = None) -> Any:
        """The :class:`Location` of ``key`` (``default`` if absent)."""
        i = self._index.get(key)
        if i is None:
            return default
        f = self._fid[i]
        if f < 0:
            return Location(0, None, 0, self._len[i], self._inline[i])
        store, file = self._files[f]
        return Location(store, file, self._off[i], self._len[i])

    def __getitem__(self, key: str) -> Location:
        loc = self.get(key)
        if loc is None:
            raise KeyError(key)
        return loc  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def columns(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per key, as NumPy columns: the index of its data file in :attr:`files` (``-1``:
        inline), its offset and its length; ``None`` if a key is absent."""
        idx = list(map(self._index.get, keys))
        if None in idx:
            return None
        cols = self._np
        if cols is None or len(cols[0]) != len(self._fid):
            cols = self._np = (np.array(self._fid, np.int64), np.array(self._off, np.int64),
                               np.array(self._len, np.int64))
        ix = np.array(idx, np.int64)
        return cols[0][ix], cols[1][ix], cols[2][ix]

    @property
    def files(self) -> list[tuple[int, str]]:
        """``(store, file)`` of each data file, as :meth:`columns` numbers them."""
        return self._files

    def inline_values(self, keys: Sequence[str]) -> tuple[list[bytes | None], bool]:
        """Each key's inline value (``None``: absent or stored out of line), and whether any
        key is stored out of line."""
        index, fid, inline = self._index, self._fid, self._inline
        got: list[bytes | None] = []
        out_of_line = False
        for k in keys:
            i = index.get(k)
            if i is None:
                got.append(None)
            elif fid[i] < 0:
                got.append(inline[i])
            else:
                got.append(None)
                out_of_line = True
        return got, out_of_line

    def locate(self, keys: Sequence[str]) -> list[Location | None]:
        """:meth:`get` of each key."""
        get = self.get
        return [get(k) for k in keys]


def _decode_keys(keys: list[bytes]) -> list[str]:
    """``[k.decode("utf-8", "surrogateescape") for k in keys]``, in one decode when no key
    holds a newline (UTF-8 decoding of the joined bytes splits at the ASCII separators)."""
    blob = b"\n".join(keys)
    if blob.count(b"\n") == len(keys) - 1 and keys:
        return blob.decode("utf-8", "surrogateescape").split("\n")
    return [k.decode("utf-8", "surrogateescape") for k in keys]


def _safe_path(fk: bytes, where: str) -> str:
    try:
        path = fk.decode("utf-8")
        validate_key(path)
    except (UnicodeDecodeError, ValueError) as err:
        raise CorruptionError(f"unsafe data file path {fk!r}: {err}", path=where) from err
    return path
