"""A :class:`KvStore` on a local directory, using the OS directly for speed.

Writes go to a temporary file that is renamed into place (then the directory is synced), so
readers never see a partial value.  Conditional writes are atomic between processes, and
follow TensorStore's file-driver protocol so both libraries can commit to one database: the
writer holds an exclusive lock on a sibling ``<key>.__lock`` file while it checks the
generation, writes the new value into that lock file and renames it over the key.

Symbolic links below the root never take us outside it.  **Reads** resolve a key beneath the
root, as ``openat2(RESOLVE_BENEATH)`` does: a relative link that stays inside the root (OME-Zarr
stores link chunks to another array of the same store) is followed; an absolute link, a link
whose ``..`` climbs above the root, or a path through such a link meets
:class:`~ocdbt_py.errors.StorageError` naming the link (never its target), and nothing outside
is read.  **Writes** follow no link at all (the lock files and data directories included): they
walk the key's directories with ``O_NOFOLLOW``-opened directory descriptors and open the last
component with ``O_NOFOLLOW``, so a database or checkpoint made by someone else cannot make us
write anywhere but where the key says.  The root itself may be a link (the caller chose it).
Listings do not descend into linked directories.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import errno
import hashlib
import os
import stat
import struct
import sys
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

__all__ = ["LocalStore", "create_beneath", "key_below", "open_beneath", "open_dir_beneath", "stat_beneath",
           "symlink_error"]

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

    def __init__(self, root: str | os.PathLike[str], *, read_only: bool = False,
                 no_follow_from: str | os.PathLike[str] | None = None):
        """``no_follow_from``: a directory above ``root`` from which no link is followed (so
        neither is one in ``root``'s own components below it); default: ``root`` itself."""
        self.root = os.path.abspath(os.fspath(root))
        self.read_only = read_only
        self._dir_lock = threading.Lock()
        #: files are opened below ``_anchor`` as ``_lead + key`` with no link followed
        self._anchor = self.root
        self._lead: list[str] = []
        if no_follow_from is not None:
            anchor = os.path.abspath(os.fspath(no_follow_from))
            lead = key_below(anchor, self.root)
            if lead is None:
                raise ValueError(f"{anchor} is not a directory above {self.root}")
            self._anchor, self._lead = anchor, lead.split("/")

    def _anchored(self, key: str) -> str:
        """``key`` relative to :meth:`no_follow_root`."""
        return "/".join([*self._lead, key]) if self._lead else key

    @property
    def url(self) -> str:
        return "file://" + self.root

    def _path(self, key: str) -> str:
        validate_key(key)
        return os.path.join(self.root, *key.split("/"))

    def local_path(self, key: str = "") -> str | None:
        """The file of ``key`` below :attr:`root` (``""``: the root directory itself)."""
        return self._path(key) if key else self.root

    def no_follow_root(self) -> str | None:
        """:attr:`root` (or the ``no_follow_from`` directory above it): no symbolic link below
        it is followed."""
        return self._anchor

    def _fail(self, what: str, key: str, exc: OSError) -> StorageError:
        if isinstance(exc, StorageError):  # e.g. a link refused: already says what and where
            return StorageError(str(exc))
        return StorageError(f"{what} {self.url}/{key} failed: {exc.strerror or exc}")

    def _dir(self, key: str, *, create: bool = False) -> tuple[int, str]:
        """``(descriptor of the key's directory, last component)``; the caller closes it.

        Raises ``FileNotFoundError``/``NotADirectoryError`` when a directory is absent (and
        ``create`` is false) and :class:`StorageError` when one is a symbolic link.
        """
        validate_key(key)
        parts = key.split("/")
        return open_dir_beneath(self._anchor, self._lead + parts[:-1], create=create, url=self.url), parts[-1]

    # -- reading -------------------------------------------------------------------------
    def get(self, key: str, byte_range: ByteRange | None = None) -> bytes | None:
        check_range(byte_range)
        validate_key(key)
        try:
            fd = open_beneath(self._anchor, self._anchored(key), os.O_RDONLY | getattr(os, "O_BINARY", 0),
                              url=self.url, validated=True)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
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
        validate_key(key)
        try:
            st = stat_beneath(self._anchor, self._anchored(key), url=self.url)
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

    def _walk_top(self, top: str) -> str | None:
        """The directory ``top`` (a prefix ending in ``/``, or empty) if it exists and no
        component below the root is a link (else ``None``; a link raises)."""
        names = [n for n in top.split("/") if n]
        try:
            os.close(open_dir_beneath(self._anchor, self._lead + names, create=False, url=self.url))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._fail("listing", top, e) from e
        return os.path.join(self.root, *names) if names else self.root

    def list(
        self, prefix: str = "", *, start: str | None = None, stop: str | None = None
    ) -> Iterator[str]:
        validate_prefix(prefix)
        # Walk only the deepest directory that contains every candidate.
        slash = prefix.rfind("/")
        top = prefix[: slash + 1] if slash >= 0 else ""
        top_path = self._walk_top(top)
        if top_path is None:
            return
        keys: list[bytes] = []
        pb = prefix.encode()
        for dirpath, dirnames, filenames in os.walk(top_path):  # never descends into links
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
        dirs: list[str] = []
        files: list[str] = []
        path = self._walk_top(prefix.strip("/"))
        if path is None:
            return dirs, files
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
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

    def _write_temp(self, dfd: int, name: str, value: bytes | bytearray | memoryview | Sequence[Any]) -> str:
        tmp = f"{name}{TMP_MARK}{uuid.uuid4().hex}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
        fd = os.open(tmp, flags, 0o644, dir_fd=dfd)
        try:
            parts: Sequence[Any] = [value] if isinstance(value, (bytes, bytearray, memoryview)) else value
            for part in parts:
                _write_all(fd, part)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        return tmp

    def set(self, key: str, value: bytes | bytearray | memoryview) -> None:
        self.set_parts(key, [value])

    def set_parts(self, key: str, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Store the concatenation of ``parts`` without joining them in memory."""
        validate_key(key)
        self._check_writable()
        try:
            dfd, name = self._dir(key, create=True)
        except OSError as e:
            raise self._fail("writing", key, e) from e
        try:
            tmp = self._write_temp(dfd, name, parts)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # replaces a link, never its target
            _fsync_fd(dfd)
        except OSError as e:
            raise self._fail("writing", key, e) from e
        finally:
            os.close(dfd)

    def delete(self, key: str) -> None:
        validate_key(key)
        self._check_writable()
        try:
            dfd, name = self._dir(key)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise self._fail("deleting", key, e) from e
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._fail("deleting", key, e) from e
        finally:
            os.close(dfd)

    def get_with_generation(self, key: str) -> tuple[bytes | None, str | None]:
        try:
            dfd, name = self._dir(key)
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except OSError as e:
            raise self._fail("reading", key, e) from e
        try:
            return _read_with_generation(dfd, name, self.url, key)
        except OSError as e:
            raise self._fail("reading", key, e) from e
        finally:
            os.close(dfd)

    def set_if(
        self, key: str, value: bytes | bytearray | memoryview, *, if_generation: str | None
    ) -> str:
        """Compare-and-swap with TensorStore's file-driver protocol (so both can share a key).

        The writer takes an exclusive open-file-description lock on ``<key>.__lock`` (making
        sure it still is the file at that path), checks the condition, then writes the new
        value into the lock file, syncs it and renames it over ``<key>``; on a failed
        condition it removes the lock file.  The generation includes a content digest, so an
        inode reused within one timestamp tick cannot fake an unchanged generation.  A lock
        file that is a link (symbolic or hard) is refused, never written through.
        """
        validate_key(key)
        self._check_writable()
        if fcntl is None:  # pragma: no cover
            raise UnsupportedError(f"{self.url}: conditional writes need POSIX file locks")
        try:
            dfd, name = self._dir(key, create=True)
        except OSError as e:
            raise self._fail("locking", key, e) from e
        try:
            return self._set_if_in(dfd, name, key, value, if_generation)
        finally:
            os.close(dfd)

    def _set_if_in(
        self, dfd: int, name: str, key: str, value: bytes | bytearray | memoryview, if_generation: str | None
    ) -> str:
        lock_name = name + _LOCK_SUFFIX
        try:
            fd = _acquire_lock(dfd, lock_name, self.url, key + _LOCK_SUFFIX)
        except OSError as e:
            raise self._fail("locking", key, e) from e
        keep_lock_file = False
        try:
            try:
                current = _read_with_generation(dfd, name, self.url, key)[1]
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
                os.rename(lock_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                keep_lock_file = True
                _fsync_fd(dfd)
            except OSError as e:
                raise self._fail("writing", key, e) from e
            return _generation(st, bytes(memoryview(value).cast("B")) if st.st_size <= _HASH_LIMIT else None)
        finally:
            if not keep_lock_file:
                with contextlib.suppress(OSError):
                    os.unlink(lock_name, dir_fd=dfd)
            os.close(fd)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


def symlink_error(url: str, key: str) -> StorageError:
    """The error for a symbolic link met below a store's root where none is followed (writes)."""
    return StorageError(f"{url}/{key} is a symbolic link: links inside a store are never followed")


def symlink_escape_error(url: str, key: str, why: str = "leads out of the store") -> StorageError:
    """The error for a link a read may not follow: it ``why`` (its target is never quoted)."""
    return StorageError(f"{url}/{key} is a symbolic link that {why}: reads follow links only beneath the root")


def _is_link(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir_beneath(root: str, names: Sequence[str], *, create: bool = False, url: str | None = None) -> int:
    """A descriptor of the directory ``root/names...``, opened one component at a time with
    ``O_NOFOLLOW`` so that no component below ``root`` may be a symbolic link (``root`` itself
    may be).  With ``create`` missing directories (``root`` included) are made.  Raises
    ``FileNotFoundError``/``NotADirectoryError`` for an absent directory and
    :class:`StorageError` for a link."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, _DIR_FLAGS)
    try:
        for i, name in enumerate(names):
            try:
                nfd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                nfd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if _is_link(fd, name):
                    raise symlink_error(url or "file://" + root, "/".join(names[: i + 1])) from e
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_RESOLVE_NO_SYMLINKS = 0x04
_SYS_OPENAT2 = 437  # the same number on every Linux architecture (unified syscall table)
_AT_FDCWD = -100
_openat2: Any = None  # libc's syscall(), once found to support openat2; False: unavailable
_real_roots: dict[str, str] = {}
_hows: dict[int, Any] = {}  # open flags -> a reference to its (immortal) open_how
_HOW_SIZE = ctypes.sizeof(_OpenHow)


def _syscall() -> Any:
    global _openat2
    if _openat2 is None:
        _openat2 = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.syscall
                fn.restype = ctypes.c_long
                fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
                _openat2 = fn
            except (OSError, AttributeError):
                pass
    return _openat2


def _open_fast(root: str, key: str, flags: int) -> int | None:
    """One ``openat2(RESOLVE_NO_SYMLINKS)`` of ``realpath(root)/key`` (Linux >= 5.6): the fd,
    ``None`` when the fast path cannot answer (no openat2, or a link met: the caller walks to
    say which), or the ``OSError`` of an absent or unreadable file."""
    global _openat2
    fn = _syscall()
    if not fn:
        return None
    real = _real_roots.get(root)
    if real is None:
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            return None
        if len(_real_roots) < 4096:
            _real_roots[root] = real
    path = (real.rstrip("/") + "/" + key).encode("utf-8", "surrogateescape")
    how = _hows.get(flags)
    if how is None:
        how = _hows[flags] = ctypes.byref(_OpenHow(flags | _CLOEXEC | _NOFOLLOW, 0, _RESOLVE_NO_SYMLINKS))
    fd = fn(_SYS_OPENAT2, _AT_FDCWD, path, how, _HOW_SIZE)
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL):
        _openat2 = False  # old kernel or a sandbox: walk from now on
        return None
    if err in (errno.ELOOP, errno.EXDEV, errno.EAGAIN):
        return None
    raise OSError(err, os.strerror(err), os.fsdecode(path))


def open_beneath(root: str, key: str, flags: int = os.O_RDONLY, *, url: str | None = None,
                 validated: bool = False, follow_inner: bool = True) -> int:
    """Open the file ``key`` (a ``/``-separated relative key, checked unless ``validated``)
    below ``root``; raises like :func:`open_dir_beneath`.

    To read (``flags`` with no write or create bit) the key is resolved beneath ``root`` as
    ``openat2(RESOLVE_BENEATH)`` does: links that stay below ``root`` are followed, one that
    leads out (absolute, or climbing above ``root``) raises :class:`StorageError`.  On Linux one
    ``openat2(RESOLVE_NO_SYMLINKS)`` call answers when the path holds no link; otherwise the
    path is walked component by component (:func:`_resolve_beneath`).  To write (or with
    ``follow_inner=False``: a writer reopening its own files), no link is followed at all: the
    directories are walked with ``O_NOFOLLOW``."""
    if not validated:
        validate_key(key)
    if not flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
        fd = _open_fast(root, key, flags)
        if fd is not None:
            if not flags & _PATH or not stat.S_ISLNK(os.fstat(fd).st_mode):
                return fd
            os.close(fd)  # O_PATH | O_NOFOLLOW opened a link itself: resolve it below
        if follow_inner:
            return _resolve_beneath(root, key, flags, url or "file://" + root)
    parts = key.split("/")
    url = url or "file://" + root
    dfd = open_dir_beneath(root, parts[:-1], url=url)
    try:
        return _open_file(dfd, parts[-1], flags, url, key)
    finally:
        os.close(dfd)


#: The most links one read resolves (Linux's own limit, ``MAXSYMLINKS``): more is a loop.
MAX_LINKS = 40
_PATH = getattr(os, "O_PATH", 0)


def _resolve_beneath(root: str, key: str, flags: int, url: str) -> int:
    """Open ``key`` below ``root`` for reading, following the links that stay beneath it.

    Walks with directory descriptors: each component is opened with ``O_NOFOLLOW`` relative to
    the descriptor of its parent, so what is checked is what is opened.  A link met is read
    with ``readlinkat`` and its target's components are resolved in its place; ``..`` returns
    to the parent descriptor (held on a stack).  Refused, naming the first link on the key's
    own path (the one that led there) and never a target: an absolute target, a ``..`` above
    ``root``, more than :data:`MAX_LINKS` links.
    Raises ``FileNotFoundError``/``NotADirectoryError`` for an absent file or directory."""
    stack = [os.open(root, _DIR_FLAGS)]
    names: list[str] = []
    todo = key.split("/")[::-1]
    links = 0
    link_key = ""
    try:
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) == 1:
                    raise symlink_escape_error(url, link_key, "climbs above the root")
                os.close(stack.pop())
                names.pop()
                continue
            dfd = stack[-1]
            try:
                if todo:
                    stack.append(os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dfd))
                    names.append(name)
                    continue
                fd = os.open(name, flags | _NOFOLLOW | _CLOEXEC, dir_fd=dfd)
                if not flags & _PATH or not stat.S_ISLNK(os.fstat(fd).st_mode):
                    return fd
                os.close(fd)
            except OSError:
                if not _is_link(dfd, name):
                    raise
            links += 1
            link_key = link_key or "/".join([*names, name])  # errors name the key's own link
            if links > MAX_LINKS:
                raise symlink_escape_error(url, link_key, f"starts a chain of more than {MAX_LINKS} links")
            target = os.readlink(name, dir_fd=dfd)
            if not target or target.startswith("/"):
                raise symlink_escape_error(url, link_key, "is absolute" if target else "is empty")
            todo.extend(target.split("/")[::-1])
        raise IsADirectoryError(errno.EISDIR, "is the root directory", key)
    finally:
        for fd in stack:
            os.close(fd)


def stat_beneath(root: str, key: str, *, url: str | None = None) -> os.stat_result:
    """``stat`` of ``key`` below ``root``, resolved as a read is (see :func:`open_beneath`)."""
    fd = open_beneath(root, key, _PATH or os.O_RDONLY, url=url, validated=True)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def create_beneath(root: str, key: str, *, url: str | None = None) -> tuple[int, int]:
    """``(directory descriptor, file descriptor)`` of the file ``key`` below ``root``, created
    (or truncated) for writing with missing directories made and no symbolic link followed
    below ``root``, the file itself included; the caller closes both.  Keeping the directory's
    descriptor lets the caller remove the file later (``os.unlink(name, dir_fd=...)``) even
    if a directory on the way has been swapped for a link since."""
    validate_key(key)
    parts = key.split("/")
    url = url or "file://" + root
    dfd = open_dir_beneath(root, parts[:-1], create=True, url=url)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0)
        return dfd, _open_file(dfd, parts[-1], flags, url, key)
    except BaseException:
        os.close(dfd)
        raise


def key_below(root: str, path: str) -> str | None:
    """The ``/``-separated key of ``path`` below the directory ``root`` (both as a store
    builds them, by joining), or ``None`` when ``path`` is not below it."""
    rel = os.path.relpath(path, root)
    if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return rel.replace(os.sep, "/")


def _open_file(dfd: int, name: str, flags: int, url: str, key: str, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR) and _is_link(dfd, name):
            raise symlink_error(url, key) from e
        raise


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


def _fsync_fd(fd: int) -> None:
    """Make a rename in the directory open as ``fd`` durable (best effort)."""
    with contextlib.suppress(OSError):
        os.fsync(fd)


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


def _acquire_lock(dfd: int, lock_name: str, url: str, key: str) -> int:
    """Open and lock ``lock_name`` in ``dfd``, retrying until the locked file is the one at
    that name.  A lock file that is a symbolic link or has other hard links is refused: the
    new value is written into it, which would write through the link."""
    flags = os.O_RDWR | os.O_CREAT
    fd = _open_file(dfd, lock_name, flags, url, key)
    while True:
        try:
            if os.fstat(fd).st_nlink > 1:
                raise StorageError(f"{url}/{key} has other hard links: refusing to write through it")
            _lock_fd(fd)
            other = _open_file(dfd, lock_name, flags, url, key)
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


def _read_with_generation(dfd: int, name: str, url: str, key: str) -> tuple[bytes | None, str | None]:
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
    try:
        try:
            # no access-time update: it would add a journaled metadata write to every commit
            fd = _open_file(dfd, name, flags | _NOATIME, url, key)
        except PermissionError:  # O_NOATIME needs ownership of the file
            fd = _open_file(dfd, name, flags, url, key)
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
