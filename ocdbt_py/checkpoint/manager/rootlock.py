"""One writing manager per root: an advisory lock held by the primary process's managers.

Two managers writing one root from two processes race each other's saves, deletions and
clean-up (each deletes what the other is writing; retention counts only its own view), so a
manager that would write (primary process, not ``read_only``) first takes an exclusive
``flock`` on the root directory itself (no file is created: listings of the root are
unchanged).  The kernel drops it when the process ends, so a killed run never leaves a stale
lock.  Managers of one process share one hold (they are the same program).  Where the
filesystem cannot lock directories the manager goes on without the lock; roots on object
stores have none: one writer per root stays the caller's job there, as with Orbax.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from ocdbt_py.errors import OcdbtError, StorageError
from ocdbt_py.kvstore.base import KvStore

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["RootInUseError", "acquire"]

_guard = threading.Lock()
_held: dict[tuple[int, int], list[int]] = {}  # (device, inode) of the root -> [fd, users]


class RootInUseError(OcdbtError):
    """Another process has a writing CheckpointManager open on the same root."""


def acquire(kv: KvStore, *, create: bool = False) -> Callable[[], None] | None:
    """Lock the local root of ``kv`` for this process; returns the function that releases this
    hold (``None``: nothing held).  Raises :class:`RootInUseError` when another process holds it.

    A missing root is made only with ``create`` (a manager opened on a root that does not exist
    yet leaves it absent, as Orbax's ``create=False`` does, and takes the lock at its first save);
    without it a missing root holds nothing and the caller asks again later."""
    root = kv.local_path()
    if root is None or fcntl is None:
        return None
    try:
        if create:
            os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if create:
            raise StorageError(f"cannot open {root}: it vanished while being made") from None
        return None
    except OSError as e:
        raise StorageError(f"cannot open {root}: {e.strerror or e}") from e
    st = os.fstat(fd)
    ident = (st.st_dev, st.st_ino)
    with _guard:
        entry = _held.get(ident)
        if entry is not None:  # this process holds it already: share the hold
            os.close(fd)
            entry[1] += 1
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RootInUseError(
                        f"{kv.url} is in use by another process's CheckpointManager: two managers writing one "
                        f"root delete each other's saves; close the other one, or open this one with "
                        f"read_only=True to list and restore") from e
                return None  # a filesystem that cannot lock directories: no lock
            _held[ident] = [fd, 1]
    released = [False]

    def release() -> None:
        with _guard:
            if released[0]:
                return
            released[0] = True
            held = _held.get(ident)
            if held is None:
                return
            held[1] -= 1
            if held[1] == 0:
                del _held[ident]
                os.close(held[0])  # drops the lock

    return release
