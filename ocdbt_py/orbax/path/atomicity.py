"""``ocp.path.atomicity``: how a save becomes visible, as Orbax names the two ways.

``AtomicRenameTemporaryPath`` (write into ``<name>.orbax-checkpoint-tmp``, then rename it to
``<name>``) and ``CommitFileTemporaryPath`` (write into ``<name>`` itself, then add
``commit_success.txt``) are what ``Checkpointer(temporary_path_class=...)`` and
``CheckpointManagerOptions(temporary_path_class=...)`` take.  A checkpointer saving to a local
directory goes through them as Orbax's does: ``from_final(directory)``, :meth:`create`, the
handler writes into :meth:`get`, then :meth:`finalize` makes the checkpoint visible (a save
interrupted before ``finalize`` leaves the temporary directory, which restores refuse as an
incomplete checkpoint).  The native saves (:func:`ocdbt_py.checkpoint.save`, the manager)
commit the same two ways by themselves (``spec/orbax.md``).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from typing import Any

from ocdbt_py.checkpoint.layout import COMMIT_MARKER, STEP_METADATA
from ocdbt_py.checkpoint.saving.atomic import TMP_SUFFIX, fsync_dir
from ocdbt_py.checkpoint.saving.layout_writer import commit_marker

__all__ = ["COMMIT_SUCCESS_FILE", "TMP_DIR_SUFFIX", "TemporaryPath", "AtomicRenameTemporaryPath",
           "CommitFileTemporaryPath"]

COMMIT_SUCCESS_FILE = COMMIT_MARKER
TMP_DIR_SUFFIX = TMP_SUFFIX
_OLD_SUFFIX = TMP_SUFFIX + "-old"


def _stamp_commit(path: pathlib.Path) -> None:
    """As Orbax's ``finalize``: ``commit_timestamp_nsecs`` of the ``_CHECKPOINT_METADATA`` in
    ``path`` (when there is one) set to now."""
    f = path / STEP_METADATA
    try:
        doc = json.loads(f.read_bytes())
    except (OSError, ValueError):
        return
    if isinstance(doc, dict):
        doc["commit_timestamp_nsecs"] = time.time_ns()
        f.write_text(json.dumps(doc), encoding="utf-8")


class TemporaryPath:
    """Where a checkpoint is written (:meth:`get`) until :meth:`finalize` makes it the one at
    :meth:`get_final` (local directories)."""

    def __init__(self, temporary_path: str | os.PathLike[str], final_path: str | os.PathLike[str]):
        self._tmp = pathlib.Path(os.fspath(temporary_path))
        self._final = pathlib.Path(os.fspath(final_path))

    @classmethod
    def from_final(cls, final_path: str | os.PathLike[str], **ignored: Any) -> TemporaryPath:
        """The temporary path for a checkpoint that ends up at ``final_path``."""
        raise NotImplementedError

    def get(self) -> pathlib.Path:
        """The directory written into."""
        return self._tmp

    def get_final(self) -> pathlib.Path:
        """The directory the checkpoint ends up at."""
        return self._final

    def create(self) -> pathlib.Path:
        """Make the directory written into (parents too); returns it."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        return self._tmp

    def finalize(self) -> None:
        """Make the written checkpoint visible at :meth:`get_final`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._tmp)!r} -> {str(self._final)!r})"


class AtomicRenameTemporaryPath(TemporaryPath):
    """Write into ``<name>.orbax-checkpoint-tmp``, then rename it to ``<name>``."""

    @classmethod
    def from_final(cls, final_path: str | os.PathLike[str], **ignored: Any) -> AtomicRenameTemporaryPath:
        """``<final_path>.orbax-checkpoint-tmp``."""
        final = pathlib.Path(os.fspath(final_path))
        if TMP_DIR_SUFFIX in final.name:
            raise ValueError(f'Expected final AtomicRenameTemporaryPath ({final}) not to end with "{TMP_DIR_SUFFIX}".')
        return cls(final.parent / (final.name + TMP_DIR_SUFFIX), final)

    def create(self) -> pathlib.Path:
        """A fresh temporary directory (a stale one left by an interrupted save is removed)."""
        if self._tmp.is_symlink():
            raise ValueError(f"{self._tmp} is a symbolic link; refusing to write a checkpoint through it")
        if self._tmp.exists():
            shutil.rmtree(self._tmp)
        self._tmp.mkdir(parents=True)
        return self._tmp

    def finalize(self) -> None:
        """Rename the temporary directory to the final one (durably).  A checkpoint already
        there (a save with ``force``) is moved aside first and removed after the rename.  As
        Orbax's: the commit time is stamped and ``commit_success.txt`` written first."""
        _stamp_commit(self._tmp)
        (self._tmp / COMMIT_SUCCESS_FILE).write_bytes(commit_marker(str(self._final)))
        fsync_dir(self._tmp)
        old = None
        if os.path.lexists(self._final):
            old = self._final.parent / (self._final.name + _OLD_SUFFIX)
            if os.path.lexists(old):
                shutil.rmtree(old)
            os.rename(self._final, old)
        os.rename(self._tmp, self._final)
        fsync_dir(self._final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


class CommitFileTemporaryPath(TemporaryPath):
    """Write into ``<name>`` itself, then add ``commit_success.txt``."""

    @classmethod
    def from_final(cls, final_path: str | os.PathLike[str], **ignored: Any) -> CommitFileTemporaryPath:
        """The final directory itself."""
        return cls(final_path, final_path)

    def finalize(self) -> None:
        """Stamp the commit time, then write ``commit_success.txt`` (last)."""
        _stamp_commit(self._final)
        (self._final / COMMIT_SUCCESS_FILE).write_bytes(commit_marker(str(self._final)))
        fsync_dir(self._final)


def is_finalized(path: str | os.PathLike[str], temporary_path_class: type[TemporaryPath] | None = None) -> bool:
    """Whether the checkpoint directory ``path`` was finalized: not a temporary directory's
    name, and with ``CommitFileTemporaryPath`` its ``commit_success.txt`` present."""
    p = pathlib.Path(os.fspath(path))
    if TMP_DIR_SUFFIX in p.name:
        return False
    if temporary_path_class is not None and issubclass(temporary_path_class, CommitFileTemporaryPath):
        return (p / COMMIT_SUCCESS_FILE).exists()
    return True
