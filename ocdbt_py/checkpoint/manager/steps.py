"""A manager root's steps: listing, what each step records, cleanup and deletion."""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ocdbt_py.checkpoint.jsonio import read_json
from ocdbt_py.checkpoint.layout import COMMIT_MARKER, TMP_SUFFIX
from ocdbt_py.checkpoint.layout import list_steps as _list_steps
from ocdbt_py.checkpoint.manager.naming import StepNameFormat
from ocdbt_py.checkpoint.manager.preservation import StepInfo
from ocdbt_py.errors import CorruptionError, StorageError
from ocdbt_py.kvstore.base import KvStore
from ocdbt_py.kvstore.local import key_below, open_dir_beneath
from ocdbt_py.pools import map_concurrently

__all__ = ["BadStepWarning", "MAX_TIME_NS", "METRICS_ITEM", "METRICS_FILE", "scan", "read_step_info", "cleanup",
           "delete_step", "writes_in_place", "metrics_json"]

#: Orbax keeps a step's metrics as the JSON item ``metrics`` in the file ``metrics``.
METRICS_ITEM = "metrics"
METRICS_FILE = "metrics"
_STEP_METADATA = "_CHECKPOINT_METADATA"
_DELETING = TMP_SUFFIX + "-deleting-"


def committed(kv: KvStore, fmt: StepNameFormat) -> dict[int, str]:
    """``{step: directory name}`` of the finalized steps named in ``fmt``.

    Where saves write in place (any root but a local directory, including a
    :class:`~ocdbt_py.kvstore.MemoryStore` or a wrapped store), only steps with their commit
    marker count: an unmarked one may be an interrupted save even when no step has a marker.
    """
    out: dict[int, str] = {}
    need_marker = writes_in_place(kv)
    for e in _list_steps(kv, warn=False):
        s = fmt.parse(e.name)
        if s is not None and s not in out and (e.committed or not need_marker):
            out[s] = e.name
    return dict(sorted(out.items()))


#: The latest time a step may record, in nanoseconds since the epoch: the end of the year
#: 9999, the last instant ``datetime`` (and so Orbax's ``CheckpointInfo.time``) can hold.
MAX_TIME_NS = 253_402_300_799 * 10**9


class BadStepWarning(UserWarning):
    """A step of a manager root is skipped because what it records cannot be used."""


def _as_time(meta: Mapping[str, Any] | None, fallback: float, where: str) -> float:
    if meta:
        for key in ("commit_timestamp_nsecs", "init_timestamp_nsecs"):
            v = meta.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                if v > MAX_TIME_NS:
                    raise CorruptionError(f"{key} {v} is out of range (after the year 9999)", path=where)
                return v / 1e9
    return fallback


def read_step_info(kv: KvStore, step: int, name: str, *, fallback_time: float = 0.0) -> StepInfo:
    """What retention needs of one step: its commit time and metrics.

    A step whose ``_CHECKPOINT_METADATA`` records a time out of range (after the year 9999)
    raises :class:`CorruptionError`; one whose file is unreadable gets ``fallback_time``."""
    where = f"{kv.url.rstrip('/')}/{name}/{_STEP_METADATA}"
    try:
        meta = read_json(kv, f"{name}/{_STEP_METADATA}", 16 << 20)
    except CorruptionError:
        meta = None
    try:
        metrics = read_json(kv, f"{name}/{METRICS_ITEM}/{METRICS_FILE}", 16 << 20)
    except CorruptionError:
        metrics = None
    return StepInfo(step, _as_time(meta if isinstance(meta, dict) else None, fallback_time, where),
                    metrics if isinstance(metrics, dict) else None)


def scan(kv: KvStore, fmt: StepNameFormat, *, workers: int = 16) -> tuple[dict[int, str], dict[int, StepInfo]]:
    """The finalized steps of a root and their :class:`StepInfo`, read concurrently.

    A step whose metadata cannot be used (:func:`read_step_info` raises
    :class:`CorruptionError`) is left out with a :class:`BadStepWarning`, so one hostile or
    damaged step does not stop a run from resuming from the others; it is never deleted."""
    names = committed(kv, fmt)
    if not names:
        return names, {}

    def info(sn: tuple[int, str]) -> StepInfo | CorruptionError:
        try:
            return read_step_info(kv, sn[0], sn[1])
        except CorruptionError as e:
            return e

    got = map_concurrently(info, names.items(), limit=workers)
    infos: dict[int, StepInfo] = {}
    for (step, name), i in zip(list(names.items()), got):
        if isinstance(i, CorruptionError):
            warnings.warn(f"skipping step {step} ({name}): {i}", BadStepWarning, stacklevel=2)
            del names[step]
        else:
            infos[step] = i
    return names, infos


def writes_in_place(kv: KvStore) -> bool:
    """Whether saves under ``kv`` write step directories in place (committed by their marker)
    rather than into a temporary directory renamed into place (local disks)."""
    return kv.local_path() is None


def cleanup(kv: KvStore, fmt: StepNameFormat, keep: Sequence[str] = (), *, only_deleted: bool = False) -> list[str]:
    """Remove what interrupted saves and deletions left under the root: temporary step
    directories, and (where directories cannot be renamed atomically, so a step's commit
    marker is its only commit point) step directories without a commit marker.

    Only names of ``fmt`` are touched; ``keep`` lists directory names left alone (saves in
    flight).  ``only_deleted``: remove only the ``*.orbax-checkpoint-tmp-deleting-*``
    directories of interrupted deletions (steps already deleted), keeping interrupted saves
    for inspection.  Returns the names removed.
    """
    dirs, _ = kv.list_dir("")
    if only_deleted:
        gone = [d for d in sorted(dirs) if _DELETING in d and fmt.parse(d.split(TMP_SUFFIX, 1)[0]) is not None
                and d not in keep]
        for d in gone:
            _remove_dir(kv, d)
        return gone
    names = committed(kv, fmt)
    done = set(names.values())
    # An unmarked step directory is an interrupted save where saves write in place, provided
    # the root demonstrably uses commit markers (legacy checkpoints copied to an object store
    # without markers are never touched).
    unmarked_is_partial = writes_in_place(kv) and any(kv.exists(f"{n}/{COMMIT_MARKER}") for n in done)
    removed: list[str] = []
    for d in sorted(dirs):
        if d in keep:
            continue
        if TMP_SUFFIX in d:
            base = d.split(TMP_SUFFIX, 1)[0]
            if fmt.parse(base) is None or any(k.split(TMP_SUFFIX, 1)[0] == base for k in keep):
                continue
        elif not (unmarked_is_partial and fmt.parse(d) is not None and d not in done):
            continue
        _remove_dir(kv, d)
        removed.append(d)
    return removed


def delete_step(kv: KvStore, name: str, *, keep_in: str | None = None) -> None:
    """Delete a step directory so that it stops being a checkpoint at once.

    Locally it is renamed to a temporary name first (atomic), then removed; elsewhere its
    commit markers go first (outermost first), then everything else.  ``keep_in`` (Orbax's
    ``todelete_subdir``): move the step into ``<root>/<keep_in>/`` instead (renamed on local
    disks between directories opened below the root with no link followed; copied, then
    deleted, elsewhere).
    """
    if keep_in is not None:
        if _move_below(kv, name, keep_in):
            return
        for key in list(kv.list(f"{name}/")):
            data = kv.get(key)
            if data is not None:
                kv.set(f"{keep_in}/{key}", data)
    path = kv.local_path(name)
    if path is not None:
        trash = f"{path}{_DELETING}{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StorageError(f"cannot delete {path}: {e}") from e
        shutil.rmtree(trash, ignore_errors=True)
        return
    _remove_dir(kv, name)


def _move_below(kv: KvStore, name: str, sub: str) -> bool:
    """Rename step ``name`` to ``<sub>/<name>`` on a local root (``False``: not a local root).
    A linked ``sub`` or step parent gets an error; a linked step moves as the link itself."""
    src, dst_dir, root = kv.local_path(name), kv.local_path(sub), kv.no_follow_root()
    src_key = key_below(root, src) if root and src else None
    dst_key = key_below(root, dst_dir) if root and dst_dir else None
    if root is None or src_key is None or dst_key is None:
        return False
    *src_dirs, src_name = src_key.split("/")
    try:
        sfd = open_dir_beneath(root, src_dirs, url=kv.url)
        try:
            dfd = open_dir_beneath(root, dst_key.split("/"), create=True, url=kv.url)
            try:
                os.rename(src_name, src_name, src_dir_fd=sfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
    except FileNotFoundError:
        return True  # already gone
    except OSError as e:
        raise StorageError(f"cannot move {src} into {dst_dir}: {e}") from e
    return True


def _remove_dir(kv: KvStore, name: str) -> None:
    path = kv.local_path(name)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        return
    prefix = name.rstrip("/") + "/"
    keys = list(kv.list(prefix))
    markers = sorted((k for k in keys if k.rsplit("/", 1)[-1] == COMMIT_MARKER), key=lambda k: k.count("/"))
    for k in markers:
        kv.delete(k)
    marked = set(markers)
    rest = [k for k in keys if k not in marked]
    map_concurrently(kv.delete, rest, limit=8)


def metrics_json(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics as plain JSON (NumPy and JAX scalars become Python numbers)."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError(f"metric names are strings, not {k!r}")
        if hasattr(v, "item") and getattr(v, "shape", None) == ():
            v = v.item()
        out[k] = v
    return out
