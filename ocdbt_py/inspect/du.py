"""``du()``: where a checkpoint's bytes are -- logical (in memory) and stored (compressed)
bytes per tensor and per subtree, and the sizes of the OCDBT data files.  Reads metadata and
the B+tree (OCDBT) or file sizes (per-parameter directories), never array data."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ocdbt_py.checkpoint.restore.api import PathLike
from ocdbt_py.inspect.source import Checkpoint, open_checkpoint

__all__ = ["Usage", "DiskUsage", "du", "checkpoint_du", "subtree_usage"]

#: An OCDBT data file: ``d/<name>`` (possibly below ``ocdbt.process_<i>/``).
_DATA_FILE = re.compile(r"(?:^|/)d/[^/]+$")


@dataclasses.dataclass
class Usage:
    """Logical and stored bytes of a tensor or subtree (``stored_bytes`` ``None``: unknown)."""

    logical_bytes: int
    stored_bytes: int | None
    arrays: int = 1

    @property
    def ratio(self) -> float | None:
        """Compression ratio ``logical / stored`` (``None`` when unknown or nothing stored)."""
        if not self.stored_bytes:
            return None
        return self.logical_bytes / self.stored_bytes

    def to_json(self) -> dict[str, Any]:
        """``{"logical_bytes", "stored_bytes", "ratio"}``."""
        return {"logical_bytes": self.logical_bytes, "stored_bytes": self.stored_bytes, "ratio": self.ratio}


@dataclasses.dataclass
class DiskUsage:
    """Per tensor usage (``{name: Usage}``, leaf order) and the data files
    (``{path below the checkpoint: size}``)."""

    tensors: dict[str, Usage]
    data_files: dict[str, int]
    step: int | None = None

    @property
    def total(self) -> Usage:
        """Everything together."""
        return _sum(self.tensors.values())


def _sum(us: Any) -> Usage:
    logical = 0
    stored: int | None = 0
    n = 0
    for u in us:
        logical += u.logical_bytes
        n += u.arrays
        stored = None if stored is None or u.stored_bytes is None else stored + u.stored_bytes
    return Usage(logical, stored, n)


def subtree_usage(usage: DiskUsage, depth: int) -> dict[str, Usage]:
    """Usage summed per subtree: names cut to their first ``depth`` dotted parts."""
    groups: dict[str, list[Usage]] = {}
    for name, u in usage.tensors.items():
        key = ".".join(name.split(".")[:depth]) if depth > 0 else ""
        groups.setdefault(key, []).append(u)
    return {k: _sum(v) for k, v in groups.items()}


def checkpoint_du(ck: Checkpoint) -> DiskUsage:
    """The :class:`DiskUsage` of an opened checkpoint (opened with ``stored_sizes=True``)."""
    tensors = {t.name: Usage(t.nbytes, t.stored_bytes) for t in ck.tensors}
    files: dict[str, int] = {}
    for prefix, it in ck.items:
        for key, size in it.kv.list_sized(""):
            if _DATA_FILE.search(key):
                if size is None:
                    size = it.kv.size(key)
                files[f"{prefix}/{key}" if prefix else key] = int(size or 0)
    return DiskUsage(tensors, dict(sorted(files.items())), ck.step)


def du(path: PathLike, *, step: int | None = None, storage_options: dict[str, Any] | None = None,
       include: list[str] | None = None) -> DiskUsage:
    """Logical and stored bytes per tensor of a checkpoint, and its data files' sizes."""
    with open_checkpoint(path, step=step, storage_options=storage_options, include=include,
                         stored_sizes=True) as ck:
        return checkpoint_du(ck)
