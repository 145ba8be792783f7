"""A :class:`KvStore` on a local directory, using the OS directly for speed.

Writes go to a temporary file that is renamed into place (then the directory is synced), so
readers never see a partial value.  Conditional writes are atomic between processes, and
follow TensorStore's file-driver protocol so both libraries can commit to one database: the
writer holds an exclusive lock on a sibling ``<key>.__lock`` file while it checks the
generation, writes the new value into that lock file and renames it over the key.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import stat
import struct
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ocdbt_py.errors import ConditionFailedError, ReadOnlyError, StorageError, UnsupportedError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, check_range, normalize_request
from ocdbt_py.kvstore.keys import validate_key, validate_prefix

try:  # POSIX only; without it conditional writes are unsupported.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalStore"]

_LOCK_SUFFIX = ".__lock"
#: Marks the temporary file of a write in progress (renamed into place when complete).
TMP_MARK = ".__tmp."


#: Values up to this size get a content digest in their generation.
_HASH_LIMIT = 64 << 20


def _generation(st: os.stat_result, data: bytes | None = None) -> str:
    digest = hashlib.blake2b(data, digest_size=12).hexdigest() if data is not None else "-"
    return f"{st.st_dev:x}.{st.st_ino:x}.{st.st_mtime_ns:x}.{st.st_size:x}.{digest}"


class LocalStore(KvStore):
    """Keys are files below ``root``; ``/`` in a key is a directory separator."""

    def __init__(self, root: str | os.PathLike[str], *, read_only: bool = False):
        self.root = os.path.abspath(os.fspath(root))
        self.read_only = read_only
        self._dir_lock = threading.Lock()

    @property
    def url(self) -> str:
        return "file://" + self.root

    def _path(self, key: str) -> str:
        validate_key(key)
        return os.path.join(self.root, *key.split("/"))

    def local_path(self, key: str = "") -> str | None:
        """The file of ``key`` below :attr:`root` (``""``: the root directory itself)."""
        return self._path(key) if key else self.root

    def _fail(self, what: str, key: str, exc: OSError) -> StorageError:
        return StorageError(f"{what} {self.url}/{key} failed: {exc.strerror or exc}")

    # -- reading -------------------------------------------------------------------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        path = self._path(key)
        check_range(byte_range)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except IsADirectoryError:
            return None
        except OSError as e:
            raise self._fail("reading", key, e) from e
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            size = st.st_size
            if byte_range is None:
                return _read_exact(fd, 0, size)
            start, stop = byte_range
            if start < 0:
                start = max(size + start, 0)
            stop = size if stop is None else min(stop, size)
            if stop <= start:
                return b""
            return _read_exact(fd, start, stop - start)
        except IsADirectoryError:
            return None
        except OSError as e:
            raise self._fail("reading", key, e) from e
        finally:
            os.close(fd)

    def size(self, key: str) -> int | None:
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._fail("reading", key, e) from e
        return None if stat.S_ISDIR(st.st_mode) else st.st_size

    def get_many(self, requests: Sequence[ReadRequest]) -> list[bytes | None]:
        reqs = [normalize_request(r) for r in requests]
        if len(reqs) < 8:
            return [self.get(k, r) for k, r in reqs]
        return super().get_many(reqs)

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        validate_prefix(prefix)
        # Walk only the deepest directory that contains every candidate.
        slash = prefix.rfind("/")
        top = prefix[: slash + 1] if slash >= 0 else ""
        top_path = os.path.join(self.root, *top.split("/")) if top else self.root
        keys: list[bytes] = []
        pb = prefix.encode()
        for dirpath, dirnames, filenames in os.walk(top_path):
            rel = os.path.relpath(dirpath, self.root)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            relb = rel.encode()
            # prune directories that cannot match the prefix
            dirnames[:] = [
                d for d in dirnames
                if (relb + d.encode() + b"/").startswith(pb) or pb.startswith(relb + d.encode() + b"/")
            ]
            for f in filenames:
                if f.endswith(_LOCK_SUFFIX) or TMP_MARK in f:
                    continue
                kb = relb + f.encode()
                if kb.startswith(pb):
                    keys.append(kb)
        keys.sort()
        lo = None if start is None else start.encode()
        hi = None if stop is None else stop.encode()
        for kb in keys:
            if lo is not None and kb < lo:
                continue
            if hi is not None and kb >= hi:
                break
            yield kb.decode()

    def list_dir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        if prefix:
            validate_prefix(prefix)
        path = os.path.join(self.root, *prefix.strip("/").split("/")) if prefix.strip("/") else self.root
        dirs: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_dir():
                        dirs.append(entry.name)
                    elif not (entry.name.endswith(_LOCK_SUFFIX) or TMP_MARK in entry.name):
                        files.append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return sorted(dirs), sorted(files)

    # -- writing -------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")

    def _write_temp(self, path: str, value: bytes | bytearray | memoryview | Sequence[Any]) -> str:
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
        try:
            parts: Sequence[Any] = [value] if isinstance(value, (bytes, bytearray, memoryview)) else value
            for part in parts:
                _write_all(fd, part)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self.set_parts(key, [value])

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Store the concatenation of ``parts`` without joining them in memory."""
        path = self._path(key)
        self._check_writable()
        try:
            tmp = self._write_temp(path, parts)
            os.replace(tmp, path)
            _fsync_dir(os.path.dirname(path))
        except OSError as e:
            raise self._fail("writing", key, e) from e

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._check_writable()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._fail("deleting", key, e) from e

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        path = self._path(key)
        try:
            return _read_with_generation(path)
        except OSError as e:
            raise self._fail("reading", key, e) from e

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        """Compare-and-swap with TensorStore's file-driver protocol (so both can share a key).

        The writer takes an exclusive open-file-description lock on ``<key>.__lock`` (making
        sure it still is the file at that path), checks the condition, then writes the new
        value into the lock file, syncs it and renames it over ``<key>``; on a failed
        condition it removes the lock file.  The generation includes a content digest, so an
        inode reused within one timestamp tick cannot fake an unchanged generation.
        """
        path = self._path(key)
        self._check_writable()
        if fcntl is None:  # pragma: no cover
            raise UnsupportedError(f"{self.url}: conditional writes need POSIX file locks")
        lock_path = path + _LOCK_SUFFIX
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = _acquire_lock(lock_path)
        except OSError as e:
            raise self._fail("locking", key, e) from e
        keep_lock_file = False
        try:
            try:
                current = _read_with_generation(path)[1]
            except OSError as e:
                raise self._fail("reading", key, e) from e
            if current != if_generation:
                raise ConditionFailedError(
                    f"conditional write of {self.url}/{key} failed: "
                    + ("it exists" if if_generation is None else "it changed since it was read")
                )
            try:
                if os.fstat(fd).st_size:  # a stale lock file left by a crashed writer
                    # (truncating only then: on ext4 a truncate is a journaled orphan-list
                    # update that makes the following fsync and rename several times slower)
                    os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                _write_all(fd, value)
                os.fsync(fd)
                st = os.fstat(fd)
                os.rename(lock_path, path)
                keep_lock_file = True
                _fsync_dir(os.path.dirname(path))
            except OSError as e:
                raise self._fail("writing", key, e) from e
            return _generation(st, bytes(memoryview(value).cast("B")) if st.st_size <= _HASH_LIMIT else None)
        finally:
            if not keep_lock_file:
                with contextlib.suppress(OSError):
                    os.unlink(lock_path)
            os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _lock_fd(fd: int) -> None:
    """Block until ``fd`` holds an exclusive lock (OFD lock on Linux, as TensorStore uses)."""
    assert fcntl is not None
    ofd = getattr(fcntl, "F_OFD_SETLKW", None)
    if ofd is not None:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (native layout)
        arg = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0) + bytes(16)
        while True:
            try:
                fcntl.fcntl(fd, ofd, arg)
                return
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                    break
                raise
    fcntl.flock(fd, fcntl.LOCK_EX)


def _acquire_lock(lock_path: str) -> int:
    """Open and lock ``lock_path``, retrying until the locked file is the one at that path."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(lock_path, flags, 0o644)
    while True:
        try:
            _lock_fd(fd)
            other = os.open(lock_path, flags, 0o644)
        except BaseException:
            os.close(fd)
            raise
        a, b = os.fstat(fd), os.fstat(other)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            os.close(other)
            return fd
        os.close(fd)  # the previous owner renamed or removed it: lock the new file
        fd = other


_NOATIME = getattr(os, "O_NOATIME", 0)


def _read_with_generation(path: str) -> tuple[bytes | None, str | None]:
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
    try:
        try:
            # no access-time update: it would add a journaled metadata write to every commit
            fd = os.open(path, flags | _NOATIME)
        except PermissionError:  # O_NOATIME needs ownership of the file
            fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        data = _read_exact(fd, 0, st.st_size)
    finally:
        os.close(fd)
    return data, _generation(st, data if len(data) <= _HASH_LIMIT else None)


def _read_exact(fd: int, offset: int, n: int) -> bytes:
    """Read up to ``n`` bytes at ``offset`` (fewer only at end of file), one allocation."""
    if n <= 0:
        return b""
    data = os.pread(fd, n, offset)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
