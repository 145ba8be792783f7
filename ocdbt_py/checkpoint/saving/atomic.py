"""Where a save writes, and how it becomes visible all at once.

* **Rename** (local directories): everything is written into ``<dir>.orbax-checkpoint-tmp``
  (a stale one is removed first), then renamed to ``<dir>``.  Replacing an existing
  checkpoint (``force=True``) swaps the two directories atomically where Linux allows it
  (``renameat2(RENAME_EXCHANGE)``) and removes the old one; elsewhere the old one is moved
  aside first.  A reader sees the old checkpoint, or (only without the atomic swap, and only
  for that instant) none, never a partial one.
* **Commit file** (object stores and every other backend, which cannot rename a directory):
  the checkpoint is written in place and ``commit_success.txt`` is written last.  Readers
  (Orbax's and ours) ignore a step directory without it.  Replacing an existing checkpoint
  deletes it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import stat
from typing import Any

from ocdbt_py.errors import OcdbtError, StorageError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.sinks import DeferredSyncStore

__all__ = ["Destination", "CheckpointExistsError", "TMP_SUFFIX", "open_destination"]

TMP_SUFFIX = ".orbax-checkpoint-tmp"
_OLD_SUFFIX = ".orbax-checkpoint-tmp-old"
_RENAME_EXCHANGE = 2
COMMIT_MARKER = "commit_success.txt"


class CheckpointExistsError(OcdbtError, FileExistsError):
    """The destination already holds something and ``force=True`` was not given."""


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries to disk (best effort: errors are ignored)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); ``False`` when unsupported."""
    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    res = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return res == 0


class Destination:
    """The target of one save: ``write_kv`` is where files go until :meth:`commit`."""

    def __init__(self, kv: KvStore, display: str, final_dir: str | None):
        self.final_kv = kv
        self.display = display
        self.final_dir = final_dir  # local directory path when renames are available
        if final_dir is not None:
            self.tmp_dir: str | None = final_dir + TMP_SUFFIX
            # opened from its parent with no link followed: a link planted (or swapped in) at
            # <dir>.orbax-checkpoint-tmp gets an error, never the checkpoint's files
            self.write_kv: KvStore = DeferredSyncStore(self.tmp_dir, no_follow_from=os.path.dirname(self.tmp_dir))
        else:
            self.tmp_dir = None
            self.write_kv = kv

    @property
    def renames(self) -> bool:
        """Whether the save is committed by renaming a temporary directory."""
        return self.final_dir is not None

    @property
    def write_display(self) -> str:
        """The path being written (the temporary directory when renaming)."""
        return self.tmp_dir if self.tmp_dir is not None else self.display

    def tmp_exists(self) -> bool:
        """Whether the temporary directory exists (as a directory, not through a link); a link
        or anything else there is :class:`StorageError`, refused on purpose."""
        if self.tmp_dir is None:
            return False
        try:
            st = os.lstat(self.tmp_dir)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StorageError(f"cannot inspect {self.tmp_dir}: {e.strerror or e}") from e
        if stat.S_ISLNK(st.st_mode):
            raise StorageError(f"{self.tmp_dir} is a symbolic link; refusing to write a checkpoint through it "
                               f"(remove it to save here)")
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{self.tmp_dir} is not a directory; refusing to replace it (remove it to save here)")
        return True

    def exists(self) -> bool:
        """Whether the final destination already holds anything."""
        if self.final_dir is not None:
            return os.path.lexists(self.final_dir)
        return next(iter(self.final_kv.list("")), None) is not None

    def prepare(self, force: bool) -> None:
        """Check the destination and make room for writing (primary process only)."""
        if self.exists():
            if not force:
                raise CheckpointExistsError(
                    f"{self.display} already exists; pass force=True to replace it"
                )
            if self.final_dir is None:
                self._delete_in_place()
        if self.tmp_dir is not None:
            stale = self.tmp_exists()
            try:
                if stale:
                    shutil.rmtree(self.tmp_dir)
                os.makedirs(self.tmp_dir)
            except OSError as e:
                raise StorageError(f"cannot create {self.tmp_dir}: {e}") from e

    def _delete_in_place(self) -> None:
        """Remove an existing checkpoint, commit markers first (outermost first), so that an
        interruption never leaves a marked but partly deleted checkpoint."""
        kv = self.final_kv
        keys = list(kv.list(""))
        markers = sorted((k for k in keys if k.rsplit("/", 1)[-1] == COMMIT_MARKER), key=lambda k: k.count("/"))
        for k in markers:
            kv.delete(k)
        marked = set(markers)
        for k in keys:
            if k not in marked:
                kv.delete(k)

    def sync(self) -> None:
        """Make what this process wrote durable (before a barrier or the commit)."""
        if self.write_kv.syncs_later:
            self.write_kv.sync_all()

    def commit(self, *, sync: bool = True) -> None:
        """Make the written checkpoint the one at the destination (``sync``: durably)."""
        if self.final_dir is None or self.tmp_dir is None:
            return
        final, tmp = self.final_dir, self.tmp_dir
        parent = os.path.dirname(final) or "."
        if sync:
            self.sync()
        if not self.tmp_exists():
            raise StorageError(f"cannot commit {tmp} to {final}: {tmp} is gone")
        try:
            fsync_dir(tmp)
            if os.path.lexists(final):
                if _exchange(tmp, final):
                    fsync_dir(parent)
                    shutil.rmtree(tmp, ignore_errors=True)
                    return
                old = final + _OLD_SUFFIX
                if os.path.lexists(old):
                    shutil.rmtree(old)
                os.rename(final, old)
                os.rename(tmp, final)
                fsync_dir(parent)
                shutil.rmtree(old, ignore_errors=True)
                return
            os.rename(tmp, final)
            fsync_dir(parent)
        except OSError as e:
            raise StorageError(f"cannot commit {tmp} to {final}: {e}") from e

    def abort(self) -> None:
        """Leave a failed save: the temporary directory stays for inspection (it is removed by
        the next save to the same destination)."""


def open_destination(location: Any, storage_options: dict[str, Any] | None = None) -> Destination:
    """The destination for ``location`` (local path, any fsspec URL, or a :class:`KvStore`)."""
    if isinstance(location, KvStore):
        path = location.local_path()
        if path is not None:
            return Destination(location, path, os.path.abspath(path))
        return Destination(location, location.url, None)
    loc = os.fspath(location)
    kv = open_kvstore(loc, storage_options)
    if kv.read_only:
        raise StorageError(f"{kv.url} is read-only")
    path = kv.local_path()
    if path is not None:
        path = os.path.abspath(path).rstrip(os.sep) or os.sep
        return Destination(kv, path, path)
    return Destination(kv, loc, None)
