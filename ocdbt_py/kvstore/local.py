"""A :class:`KvStore` on a local directory, using the OS directly for speed.

Writes go to a temporary file that is renamed into place, so readers never see a partial
value.  Conditional writes are atomic between cooperating processes: "only if absent" uses
``os.link`` (which fails if the target exists) and compare-and-swap holds an exclusive
``flock`` on a sibling ``<key>.__lock`` file while it checks the generation and renames.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import stat
import threading
import uuid
from collections.abc import Iterator, Sequence

from ocdbt_py.errors import ConditionFailedError, ReadOnlyError, StorageError, UnsupportedError
from ocdbt_py.kvstore.base import ByteRange, KvStore, ReadRequest, check_range, normalize_request
from ocdbt_py.kvstore.keys import validate_key, validate_prefix

try:  # POSIX only; without it conditional writes are unsupported.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalStore"]

_LOCK_SUFFIX = ".__lock"
_TMP_MARK = ".__tmp."


def _generation(st: os.stat_result) -> str:
    return f"{st.st_ino:x}.{st.st_mtime_ns:x}.{st.st_size:x}"


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
                if f.endswith(_LOCK_SUFFIX) or _TMP_MARK in f:
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
                    elif not (entry.name.endswith(_LOCK_SUFFIX) or _TMP_MARK in entry.name):
                        files.append(entry.name)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return sorted(dirs), sorted(files)

    # -- writing -------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"{self.url} is read-only")

    def _write_temp(self, path: str, value: bytes | bytearray | memoryview) -> str:
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        tmp = f"{path}{_TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
        try:
            view = memoryview(value).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        path = self._path(key)
        self._check_writable()
        try:
            tmp = self._write_temp(path, value)
            os.replace(tmp, path)
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
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except OSError as e:
            raise self._fail("reading", key, e) from e
        return data, _generation(st)

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        path = self._path(key)
        self._check_writable()
        if fcntl is None:  # pragma: no cover
            raise UnsupportedError(f"{self.url}: conditional writes need POSIX file locks")
        try:
            tmp = self._write_temp(path, value)
        except OSError as e:
            raise self._fail("writing", key, e) from e
        try:
            lock_fd = os.open(path + _LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                try:
                    st = os.stat(path)
                    current: str | None = _generation(st)
                except FileNotFoundError:
                    current = None
                if current != if_generation:
                    raise ConditionFailedError(
                        f"conditional write of {self.url}/{key} failed: "
                        f"generation {current} != expected {if_generation}"
                    )
                if if_generation is None:
                    try:
                        os.link(tmp, path)
                    except OSError as e:
                        if e.errno == errno.EEXIST:
                            raise ConditionFailedError(
                                f"conditional write of {self.url}/{key} failed: it exists"
                            ) from e
                        raise
                    os.unlink(tmp)
                else:
                    os.replace(tmp, path)
                return _generation(os.stat(path))
            finally:
                os.close(lock_fd)
        except OSError as e:
            raise self._fail("writing", key, e) from e
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


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
