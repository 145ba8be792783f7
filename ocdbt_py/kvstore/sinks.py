"""Streaming writes of one new key, so a large value is never held in memory whole.

:func:`open_sink` returns a file-like object for a key of a :class:`KvStore`: a real file for
local directories (synced on close), an fsspec file (multipart upload on object stores) for
fsspec stores, the backend's own streaming writer where it has one (obstore's multipart upload,
:meth:`KvStore.stream_writer`), and an in-memory list of parts handed to ``set_parts`` for
anything else.
The key only becomes meaningful once something references it (OCDBT data files are
referenced by a manifest written afterwards), so no temporary name is needed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from ocdbt_py.errors import StorageError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.keys import validate_key
from ocdbt_py.kvstore.local import LocalStore, create_beneath, key_below, open_beneath, open_dir_beneath
from ocdbt_py.pools import map_concurrently

__all__ = ["Sink", "open_sink", "DeferredSyncStore"]


class Sink(Protocol):
    """A write-only byte stream for one key."""

    def write(self, data: bytes | memoryview) -> int:
        """Append ``data``; returns its length."""

    def close(self) -> None:
        """Finish the value (durably, where the backend can)."""

    def abort(self) -> None:
        """Give up; what was written may be left behind or removed."""


class DeferredSyncStore(LocalStore):
    """A :class:`LocalStore` for a directory nobody reads until it is committed (a save's
    temporary directory): values are written in place without a sync each, and
    :meth:`sync_all` makes everything written so far durable at once (files in parallel, then
    their directories), which costs far less than two fsyncs per small file."""

    def __init__(self, root: str | os.PathLike[str], *, no_follow_from: str | os.PathLike[str] | None = None):
        super().__init__(root, no_follow_from=no_follow_from)
        self._pending: set[str] = set()
        self._pending_lock = threading.Lock()

    @property
    def syncs_later(self) -> bool:
        return True

    def note_written(self, path: str) -> None:
        """Remember a file written below the root, to be synced by :meth:`sync_all`."""
        with self._pending_lock:
            self._pending.add(path)

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        path = self._path(key)
        self._check_writable()
        try:
            dfd, fd = create_beneath(self._anchor, self._anchored(key), url=self.url)  # no link followed
        except OSError as e:
            raise self._fail("writing", key, e) from e
        try:
            with open(fd, "wb", closefd=True) as f:
                for p in parts:
                    f.write(p)
        except OSError as e:
            raise StorageError(f"writing {self.url}/{key} failed: {e}") from e
        finally:
            os.close(dfd)
        self.note_written(path)

    def delete(self, key: str) -> None:
        super().delete(key)
        with self._pending_lock:
            self._pending.discard(self._path(key))

    def sync_all(self, workers: int = 8) -> None:
        """fsync every file written since the last call, then their directories."""
        with self._pending_lock:
            files, self._pending = sorted(self._pending), set()
        if not files:
            return
        dirs: set[str] = set()
        for f in files:
            d = os.path.dirname(f)
            while d.startswith(self.root) and d not in dirs:
                dirs.add(d)
                d = os.path.dirname(d)
        errors: list[OSError] = []

        def sync(path: str, flags: int) -> None:
            # opened again below the root with no link followed (and never blocking: a file
            # swapped for a FIFO since it was written must not hang the save)
            anchor = self._anchor
            key = key_below(anchor, path)
            try:
                if key is None:
                    if path != anchor:
                        return
                    fd = os.open(path, flags)
                elif flags & _DIR:
                    fd = open_dir_beneath(anchor, key.split("/"), url=self.url)
                else:
                    fd = open_beneath(anchor, key, flags, url=self.url, validated=True, follow_inner=False)
            except OSError as e:
                errors.append(e)
                return
            try:
                os.fsync(fd)
            except OSError as e:
                if not flags & _DIR:  # directories may refuse fsync on some filesystems
                    errors.append(e)
            finally:
                os.close(fd)

        map_concurrently(lambda f: sync(f, os.O_RDONLY | _NONBLOCK), files, purpose="fsync", limit=workers)
        dflag = os.O_RDONLY | _DIR
        map_concurrently(lambda d: sync(d, dflag), sorted(dirs), purpose="fsync", limit=workers)
        if errors:
            raise StorageError(f"syncing {self.url} failed: {errors[0]}")


_DIR = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_WRITEBACK_EVERY = 32 << 20
#: parts per vectored write (below every platform's IOV_MAX)
_IOV_GROUP = 512
_SYNC_FILE_RANGE_WRITE = 2


def _writeback_starter() -> Any:
    """``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)`` (Linux), or ``None``."""
    # platform-specific: Linux only
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn


_start_writeback = _writeback_starter()


class _FileSink:
    """A local file written sequentially.  When it will be synced, writeback of what was written
    is started every 32 MiB (``sync_file_range``), so the final fsync has little left to do
    and the disk works while the next chunks are compressed.

    The file is created below the store's root with no symbolic link followed (a directory
    swapped for a link to elsewhere gets an error, not the data), and removed on abort through
    the descriptor of the directory it was created in."""

    def __init__(self, root: str, key: str, path: str, sync: bool, owner: KvStore):
        self.path = path
        later = owner.syncs_later
        self.sync = sync and not later
        self._kick = (sync or later) and _start_writeback is not None
        self._unflushed = 0
        self._name = key.rsplit("/", 1)[-1]
        self._dfd, fd = create_beneath(root, key, url=owner.url)
        self._f = open(fd, "wb", buffering=0)  # noqa: SIM115 - closed in close()/abort()
        if later:
            owner.note_written(path)

    def write(self, data: bytes | memoryview) -> int:
        n = self._write_all(memoryview(data))
        self._note(n)
        return n

    def _write_all(self, mv: memoryview) -> int:
        n = mv.nbytes
        done = 0
        while done < n:
            done += self._f.write(mv[done:])
        return n

    def write_parts(self, parts: Sequence[bytes | memoryview]) -> int:
        """Append the concatenation of ``parts`` with vectored writes (no joined copy);
        returns the bytes written."""
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(v.nbytes for v in views)
        if not hasattr(os, "writev"):  # platform-specific: no vectored writes (Windows)
            self._write_all(memoryview(b"".join(views)))
            self._note(total)
            return total
        fd = self._f.fileno()
        i = 0
        while i < len(views):
            group = views[i:i + _IOV_GROUP]
            want = sum(v.nbytes for v in group)
            done = os.writev(fd, group)
            if done < want:  # a short write: finish this group part by part
                for v in group:
                    if done >= v.nbytes:
                        done -= v.nbytes
                        continue
                    self._write_all(v[done:])
                    done = 0
            i += _IOV_GROUP
        self._note(total)
        return total

    def _note(self, n: int) -> None:
        if self._kick:
            self._unflushed += n
            if self._unflushed >= _WRITEBACK_EVERY:
                self._unflushed = 0
                _start_writeback(self._f.fileno(), 0, 0, _SYNC_FILE_RANGE_WRITE)

    def close(self) -> None:
        try:
            if self.sync:
                os.fsync(self._f.fileno())
        finally:
            self._f.close()
            os.close(self._dfd)

    def abort(self) -> None:
        self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self._name, dir_fd=self._dfd)
        os.close(self._dfd)


class _FsspecSink:
    def __init__(self, fs: Any, path: str):
        self.fs = fs
        self.path = path
        parent = path.rsplit("/", 1)[0]
        with contextlib.suppress(Exception):
            fs.makedirs(parent, exist_ok=True)
        self._f = fs.open(path, "wb")

    def write(self, data: bytes | memoryview) -> int:
        self._f.write(bytes(data) if not isinstance(data, bytes) else data)
        return memoryview(data).nbytes

    def close(self) -> None:
        self._f.close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._f.close()
        with contextlib.suppress(Exception):
            self.fs.rm_file(self.path)


class _PartsSink:
    def __init__(self, kv: KvStore, key: str):
        self.kv = kv
        self.key = key
        self._parts: list[bytes] = []

    def write(self, data: bytes | memoryview) -> int:
        self._parts.append(bytes(data))
        return len(self._parts[-1])

    def close(self) -> None:
        parts, self._parts = self._parts, []
        self.kv.set_parts(self.key, parts or [b""])

    def abort(self) -> None:
        self._parts = []


def open_sink(kv: KvStore, key: str, *, sync: bool = True) -> Sink:
    """A streaming writer for the new value of ``key`` (``sync``: fsync local files on close)."""
    validate_key(key)
    path = kv.local_path(key)
    where = kv.fsspec_location(key) if path is None else None
    try:
        if (path is not None or where is not None) and kv.read_only:
            raise StorageError(f"{kv.url} is read-only")
        if path is not None:
            root = kv.no_follow_root()
            below = key_below(root, path) if root is not None else None
            if root is None or below is None:
                raise StorageError(f"cannot write {kv.url.rstrip('/')}/{key}: {path} is not below a local store root")
            return _FileSink(root, below, path, sync, kv)
        if where is not None:
            return _FsspecSink(*where)
        if not kv.read_only:
            streamed = kv.stream_writer(key)
            if streamed is not None:
                return streamed  # type: ignore[no-any-return]
    except OSError as e:
        raise StorageError(f"cannot create {kv.url.rstrip('/')}/{key}: {e}") from e
    return _PartsSink(kv, key)
