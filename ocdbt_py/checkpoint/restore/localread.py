"""Fast reads of chunk bytes from local files into reused buffers.

Reading a checkpoint from a local disk is dominated not by the disk (the data is usually in
the page cache) but by memory: every ``pread`` into a fresh ``bytes`` object faults in and
zeroes new pages before the kernel copies into them, which costs more than decompressing.
For items on a local filesystem the reader therefore locates each chunk (file, offset, length)
once, reads neighbouring chunks of one data file with a single ``preadv`` into a buffer taken
from a small pool, and hands out memoryview slices of it; the buffer returns to the pool once
its chunks are decoded.  Remote stores keep using :meth:`KvStore.get_many`.

Locations come only from validated keys (the OCDBT data-file paths are checked like every
key), every read must return exactly the bytes requested, and a short read is corruption.
Files are opened, and per-chunk files found, with no symbolic link followed below the store's
:meth:`~ocdbt_py.kvstore.KvStore.no_follow_root` (see :func:`ocdbt_py.kvstore.local.open_beneath`).
"""

from __future__ import annotations

import functools
import mmap
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.restore.bufpool import SlabPool
from ocdbt_py.checkpoint.restore.locations import Location, LocationTable
from ocdbt_py.errors import CorruptionError, StorageError
from ocdbt_py.kvstore.coalesce import merge_ranges
from ocdbt_py.kvstore.keys import validate_key
from ocdbt_py.kvstore.local import open_beneath, stat_beneath

__all__ = ["LocalSource", "Placement"]

#: Neighbouring chunks of one file at most this far apart are read with one request...
COALESCE_GAP = 64 << 10
#: ...as long as the merged read stays below this size; single larger chunks are read alone.
COALESCE_MAX = 16 << 20
#: Buffers kept for reuse, in total bytes.
POOL_BYTES = 256 << 20
#: Chunks at least this large are mapped (``mmap``) and decoded straight from the page cache,
#: then unmapped: no copy at all.  Checkpoint files are never modified in place (writers
#: replace files, and OCDBT data files are immutable), so a mapping cannot be truncated under us.
MMAP_MIN = 1 << 20
#: Coalesced reads of several chunks at least this large are mapped too (``0``: never), and
#: their chunks decoded straight from the page cache (see :meth:`LocalSource._map_span`).
MMAP_SPAN_MIN = 1 << 20


class Placement:
    """Where the values of one :meth:`LocalSource.fetch` lie in the buffers they were read or
    mapped into: value ``i`` is ``buffers[buf[i]][rel[i]:rel[i] + size[i]]`` (``buf[i]`` is
    ``-1`` for a value in no shared buffer: inline, empty, absent or mapped alone), so values
    adjacent in one buffer were adjacent in the file.  ``release_all()`` releases every
    value's buffer at once (instead of ``done(i)`` for each)."""

    __slots__ = ("buffers", "buf", "rel", "size", "release_all")

    def __init__(self, n: int):
        self.buffers: list[Any] = []
        self.buf = [-1] * n
        self.rel = [0] * n
        self.size = [0] * n
        self.release_all: Callable[[], None] = lambda: None


def _join(root: str, key: str) -> str:
    return os.path.join(root, *key.split("/"))


def _relkey(anchor: str, path: str) -> str:
    rel = os.path.relpath(path, anchor)
    if rel == os.curdir or rel.startswith(os.pardir):
        raise StorageError(f"{path} is not below {anchor}")
    return rel.replace(os.sep, "/")


class LocalSource:
    """Locates and reads chunk keys of one item stored on the local filesystem.

    ``locate`` maps a store key (``<param>/<chunk key>``) to a :class:`Location` or ``None``
    (absent).  Built with :meth:`for_ocdbt` (from the B+tree entries: inline values and data
    file references) or :meth:`for_dirs` (one file per chunk).
    """

    def __init__(self, locate: Callable[[Sequence[str]], list[Location | None]],
                 table: Mapping[str, Location] | None = None, anchor: str | None = None):
        self.locate = locate
        #: the store's no-follow root: files below it are opened with no link followed
        self.anchor = anchor
        #: for OCDBT items: every key's location (inline values included), from one B+tree scan
        self.table = table
        self.pool = SlabPool(POOL_BYTES, COALESCE_MAX)
        self._fds: dict[str, int] = {}
        self._fd_lock = threading.Lock()

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def for_ocdbt(cls, databases: Sequence[tuple[str, Any]], anchor: str | None = None) -> LocalSource:
        """``databases``: ``(local root directory, OcdbtStore)`` pairs, searched in order."""
        table = LocationTable()
        for root, db in databases:
            table.add(db, root, 0, functools.partial(_join, root))
        return cls(table.locate, table, anchor)

    @classmethod
    def for_dirs(cls, root: str, anchor: str | None = None) -> LocalSource:
        """Per-parameter directories below ``root``: each chunk key is a file."""
        base = anchor if anchor is not None else root

        def locate(keys: Sequence[str]) -> list[Location | None]:
            out: list[Location | None] = []
            for k in keys:
                validate_key(k)
                path = os.path.join(root, *k.split("/"))
                st = _lstat_beneath(base, path)
                out.append(Location(0, path, 0, st.st_size) if st is not None and not _isdir(st) else None)
            return out

        return cls(locate, anchor=anchor)

    # -- reading ---------------------------------------------------------------------------
    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            with self._fd_lock:
                fd = self._fds.get(path)
                if fd is None:
                    try:
                        if self.anchor is not None:
                            fd = open_beneath(self.anchor, _relkey(self.anchor, path))
                        else:
                            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    except FileNotFoundError as e:
                        raise CorruptionError(f"data file {path} referenced by the checkpoint is missing") from e
                    except OSError as e:
                        raise StorageError(f"cannot open {path}: {e.strerror}") from e
                    self._fds[path] = fd
        return fd

    def _map(self, path: str, offset: int, n: int) -> tuple[mmap.mmap, memoryview, memoryview]:
        fd = self._fd(path)
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            size = os.fstat(fd).st_size
            if offset + n > size:
                raise CorruptionError(f"data file is truncated: wanted {n} bytes at offset {offset}, file has "
                                      f"{size}", path=path, offset=offset)
            mm = mmap.mmap(fd, offset + n - start, offset=start, access=mmap.ACCESS_READ)
        except OSError as e:
            raise StorageError(f"mapping {path}: {e.strerror}") from e
        base = memoryview(mm)
        return mm, base, base[offset - start: offset - start + n]

    def _read(self, path: str, offset: int, n: int) -> tuple[np.ndarray, memoryview]:
        buf = self.pool.take(n)
        mv = buf.data
        fd = self._fd(path)
        got = 0
        try:
            while got < n:
                r = os.preadv(fd, [mv[got:]], offset + got)
                if r <= 0:
                    break
                got += r
        except OSError as e:
            raise StorageError(f"reading {path}: {e.strerror}") from e
        if got != n:
            raise CorruptionError(f"data file is truncated: wanted {n} bytes at offset {offset}, got {got}",
                                  path=path, offset=offset)
        return buf, mv

    def fetch(self, keys: Sequence[str], where: Placement | None = None) -> tuple[list[Any], Callable[[int], None]]:
        """The bytes of ``keys`` (memoryviews, inline bytes, or ``None`` when absent), and a
        function ``done(i)`` to call once value ``i`` is no longer needed (buffers go back to
        the pool when all their values are done).

        With ``where``, records where each value lies (see :class:`Placement`)."""
        out: list[Any] = [None] * len(keys)
        owner: list[int] = [-1] * len(keys)
        offs, lens, by_file = self._place(keys, out)
        buffers: list[np.ndarray] = []
        pending: list[int] = []
        maps: dict[int, tuple[mmap.mmap, memoryview, memoryview]] = {}
        span_of: list[int] = [-1] * len(keys)
        mapped: list[list[Any]] = []  # [mapping, base view, member views left, chunk views]
        for path, spans in by_file:
            for _, _, g in merge_ranges(spans, gap=COALESCE_GAP, max_span=COALESCE_MAX):
                j0 = g[0]
                if len(g) == 1 and lens[j0] >= MMAP_MIN:
                    m = maps[j0] = self._map(path, offs[j0], lens[j0])
                    out[j0] = m[2]
                    continue
                start = offs[j0]
                stop = max([offs[j] + lens[j] for j in g])
                if MMAP_SPAN_MIN and stop - start >= MMAP_SPAN_MIN:
                    self._map_span(path, start, stop, g, offs, lens, out, span_of, mapped, where)
                    continue
                buf, mv = self._read(path, start, stop - start)
                b_index = len(buffers)
                buffers.append(buf)
                pending.append(len(g))
                for j in g:
                    rel = offs[j] - start
                    out[j] = mv[rel: rel + lens[j]]
                    owner[j] = b_index
                    if where is not None:
                        where.buf[j] = len(where.buffers)
                        where.rel[j] = rel
                        where.size[j] = lens[j]
                if where is not None:
                    where.buffers.append(mv)
        lock = threading.Lock()

        def done(i: int) -> None:
            out[i] = None
            s = span_of[i]
            if s >= 0:
                span_of[i] = -1
                with lock:
                    mapped[s][2] -= 1
                    last_view = mapped[s][2] == 0
                if last_view:
                    _unmap(mapped[s])
                return
            m = maps.pop(i, None)
            if m is not None:
                _unmap([m[0], m[1], 0, [m[2]]])  # the pages leave this process's resident set
                return
            b = owner[i]
            if b < 0:
                return
            owner[i] = -1
            with lock:
                pending[b] -= 1
                last = pending[b] == 0
            if last:
                self.pool.give(buffers[b])

        def done_all() -> None:
            with lock:
                out[:] = [None] * len(out)
                spans = [sp for sp in mapped if sp[2] > 0]
                for sp in spans:
                    sp[2] = 0
                span_of[:] = [-1] * len(span_of)
                ms = list(maps.values())
                maps.clear()
                bufs = [buffers[b] for b in range(len(buffers)) if pending[b] > 0]
                pending[:] = [0] * len(pending)
                owner[:] = [-1] * len(owner)
            for sp in spans:
                _unmap(sp)
            for mm, base, view in ms:
                _unmap([mm, base, 0, [view]])
            for buf in bufs:
                self.pool.give(buf)

        if where is not None:
            where.release_all = done_all
        return out, done

    def _map_span(self, path: str, start: int, stop: int, members: list[int], offs: list[int], lens: list[int],
                  out: list[Any], span_of: list[int], mapped: list[list[Any]], where: Placement | None = None
                  ) -> None:
        """Map ``[start, stop)`` of ``path`` once and hand out each member's bytes as a view of
        the mapping (no copy into a buffer, and no fresh buffer pages to fault in); the mapping
        goes once every member is done."""
        mm, base, view = self._map(path, start, stop - start)
        views = []
        s = len(mapped)
        for j in members:
            rel = offs[j] - start
            v = view[rel: rel + lens[j]]
            out[j] = v
            views.append(v)
            span_of[j] = s
            if where is not None:
                where.buf[j] = len(where.buffers)
                where.rel[j] = rel
                where.size[j] = lens[j]
        mapped.append([mm, base, len(members), views + [view]])
        if where is not None:
            where.buffers.append(view)

    def _place(self, keys: Sequence[str], out: list[Any]
               ) -> tuple[list[int], list[int], list[tuple[str, list[tuple[int, int, int]]]]]:
        """Offsets and lengths of ``keys`` (by index), and per data file the ``(start, stop,
        index)`` of its values sorted by offset; inline and empty values are put in ``out``."""
        cols = self.table.columns(keys) if isinstance(self.table, LocationTable) else None
        if cols is None:
            locs = self.locate(keys)
            offs = [0 if loc is None else loc.offset for loc in locs]
            lens = [0 if loc is None else loc.length for loc in locs]
            groups: dict[str, list[tuple[int, int, int]]] = {}
            for i, loc in enumerate(locs):
                if loc is None:
                    continue
                if loc.file is None:
                    out[i] = loc.inline
                elif loc.length == 0:
                    out[i] = b""
                else:
                    groups.setdefault(loc.file, []).append((loc.offset, loc.offset + loc.length, i))
            return offs, lens, [(f, sorted(v)) for f, v in groups.items()]
        assert isinstance(self.table, LocationTable)
        fid, off, ln = cols
        for i in np.flatnonzero(fid < 0).tolist():
            out[i] = self.table[keys[i]].inline
        for i in np.flatnonzero((fid >= 0) & (ln == 0)).tolist():
            out[i] = b""
        sel = np.flatnonzero((fid >= 0) & (ln > 0))
        order = sel[np.lexsort((off[sel], fid[sel]))]
        f_sorted = fid[order]
        cuts = (np.flatnonzero(np.diff(f_sorted)) + 1).tolist()
        starts, stops, idx = off[order].tolist(), (off[order] + ln[order]).tolist(), order.tolist()
        files = self.table.files
        by_file = []
        for lo, hi in zip([0] + cuts, cuts + [len(idx)]):
            if lo < hi:
                by_file.append((files[int(f_sorted[lo])][1], list(zip(starts[lo:hi], stops[lo:hi], idx[lo:hi]))))
        return off.tolist(), ln.tolist(), by_file

    def close(self) -> None:
        """Close the cached file descriptors."""
        with self._fd_lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self.close()


def _lstat_beneath(base: str, path: str) -> os.stat_result | None:
    """``stat`` of ``path`` below ``base``, resolved as reads are (links that stay beneath
    ``base`` followed, see :func:`~ocdbt_py.kvstore.local.open_beneath`; ``None``: absent); a
    link leading out raises :class:`StorageError`."""
    try:
        return stat_beneath(base, _relkey(base, path), url="file://" + base)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except StorageError:
        raise
    except OSError as e:
        raise StorageError(f"cannot stat {path}: {e.strerror}") from e


def _unmap(span: list[Any]) -> None:
    mm, base, _, views = span
    try:
        for v in views:
            v.release()
        base.release()
    except BufferError:
        pass
    try:
        mm.close()
    except BufferError:
        pass  # a view is still alive elsewhere; the mapping goes when it does


def _isdir(st: os.stat_result) -> bool:

    return stat.S_ISDIR(st.st_mode)
