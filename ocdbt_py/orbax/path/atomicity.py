"""``ocp.path.atomicity``: how a save becomes visible, as Orbax names the two ways.

``CommitFileTemporaryPath`` (write in place, then a ``commit_success.txt`` marker) and
``AtomicRenameTemporaryPath`` (write to a temporary directory, then rename) are the values
``CheckpointManagerOptions(temporary_path_class=...)`` takes.  ocdbt_py's saves already commit
by rename on local disks and by the marker elsewhere (``spec/orbax.md``), so the class passed
is accepted as a statement of intent; both leave a checkpoint Orbax restores.
"""

from __future__ import annotations

from ocdbt_py.checkpoint.layout import COMMIT_MARKER

__all__ = ["COMMIT_SUCCESS_FILE", "TemporaryPath", "AtomicRenameTemporaryPath", "CommitFileTemporaryPath"]

COMMIT_SUCCESS_FILE = COMMIT_MARKER


class TemporaryPath:
    """Base of the two ways a checkpoint directory is finalized."""


class AtomicRenameTemporaryPath(TemporaryPath):
    """Write into ``<name>.orbax-checkpoint-tmp-<n>``, then rename to ``<name>``."""


class CommitFileTemporaryPath(TemporaryPath):
    """Write into ``<name>`` itself, then add ``commit_success.txt``."""
