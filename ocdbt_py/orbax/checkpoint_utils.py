"""``ocp.checkpoint_utils``: ``construct_restore_args`` (restore arguments from a target tree)
and the evaluation-loop helpers ``checkpoints_iterator`` / ``wait_for_new_checkpoint``, which
snapshot the step they hand out (``<root>/_SNAPSHOTS/<step>``) as Orbax does."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.errors import NotFoundError
from ocdbt_py.kvstore import open_kvstore
from ocdbt_py.orbax.metadata_tree import TreeMetadata
from ocdbt_py.orbax.metadata_value import ArrayMetadata, Metadata, ScalarMetadata, StringMetadata
from ocdbt_py.orbax.path.step import _join, _path, standard_name_format
from ocdbt_py.orbax.type_handlers import PLACEHOLDER, ArrayRestoreArgs, RestoreArgs
from ocdbt_py.orbax.utils import is_primary_host

__all__ = ["construct_restore_args", "wait_for_new_checkpoint", "checkpoints_iterator",
           "get_snapshot_dir_from_step_dir"]

_log = logging.getLogger(__name__)
_SNAPSHOTS = "_SNAPSHOTS"


def _python_type(dtype: Any) -> type:
    """The Python scalar type a NumPy dtype's values come back as (``int``, ``float``...)."""
    return type(np.dtype(dtype).type(0).item())


def _restore_args(x: Any, sharding: Any, set_global_shape: bool, strict: bool) -> Any:
    if x is None or (isinstance(x, (dict, list, tuple)) and not x):
        return x  # empty nodes have no leaf to restore (JAX's tree functions skip them)
    jax = sys.modules.get("jax")  # JAX objects can only be in the tree when JAX is loaded

    def array_args(dtype: Any) -> ArrayRestoreArgs:
        shape = tuple(x.shape) if set_global_shape and not _is_key(x, jax) else None
        return ArrayRestoreArgs(restore_type=jax.Array if jax is not None else "jax.Array", sharding=sharding,
                                global_shape=shape, dtype=dtype, strict=strict)

    if jax is not None and isinstance(x, jax.ShapeDtypeStruct):
        return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype) if sharding is None else array_args(x.dtype)
    if isinstance(x, Metadata):
        if isinstance(x, StringMetadata):
            return RestoreArgs(restore_type=str)
        if isinstance(x, ScalarMetadata):
            return RestoreArgs(restore_type=_python_type(x.dtype), dtype=x.dtype)
        if isinstance(x, ArrayMetadata):
            return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype) if sharding is None else array_args(x.dtype)
        raise ValueError(f"Unsupported value_metadata class: {type(x)}.")
    if jax is not None and isinstance(x, jax.Array):
        return array_args(x.dtype)
    if isinstance(x, np.ndarray):
        return RestoreArgs(restore_type=type(x), dtype=x.dtype)
    if isinstance(x, (int, float)):
        return RestoreArgs(restore_type=type(x))
    if isinstance(x, str):
        return RestoreArgs(restore_type=str)
    if x is PLACEHOLDER:
        return RestoreArgs(restore_type=type(PLACEHOLDER))
    raise ValueError(f"Unsupported type: {type(x)}")


def _is_key(x: Any, jax: Any) -> bool:
    return bool(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def _sharding_of(x: Any) -> Any:
    """The sharding a target leaf names (``None`` when it names none)."""
    return getattr(x, "sharding", None)


def construct_restore_args(target: Any, sharding_tree: Any = None, set_global_shape: bool = True,
                           support_layout: bool = False, strict: bool = True) -> Any:
    """A tree of :class:`ArrayRestoreArgs` and :class:`RestoreArgs` shaped like ``target``.

    ``jax.Array`` leaves, and ``jax.ShapeDtypeStruct`` / ``ArrayMetadata`` leaves with a
    sharding (their own or ``sharding_tree``'s), give ``ArrayRestoreArgs`` (sharding, global
    shape, dtype, ``strict``); the same without a sharding, and NumPy arrays, give NumPy
    ``RestoreArgs``; ``ScalarMetadata`` gives its Python type and dtype, strings and
    ``StringMetadata`` ``str``.  A ``TreeMetadata`` target gives a ``TreeMetadata`` of
    arguments.  Any other leaf type is a ``ValueError`` ("Unsupported type"), as Orbax's.
    """
    if isinstance(target, TreeMetadata):
        shardings = sharding_tree.tree if isinstance(sharding_tree, TreeMetadata) else sharding_tree
        inner = construct_restore_args(target.tree, shardings, set_global_shape, support_layout, strict)
        return TreeMetadata.build(inner, custom_metadata=target.custom_metadata)
    is_leaf = lambda x: x is PLACEHOLDER or isinstance(x, Metadata)  # noqa: E731
    flat, rebuild = flatten_with_names(target, is_leaf=is_leaf)
    if sharding_tree is not None:
        shardings = dict(flatten_with_names(sharding_tree)[0])
        values = [shardings.get(names) for names, _ in flat]
    else:
        values = [_sharding_of(x) for _, x in flat]
    return rebuild([_restore_args(x, s, set_global_shape, strict) for (_, x), s in zip(flat, values)])


def _steps(checkpoint_dir: Any) -> list[int]:
    try:
        return [s.step for s in list_steps(checkpoint_dir)]
    except NotFoundError:
        return []


def _name_format(step_prefix: str | None, step_format_fixed_length: int | None, step_name_format: Any) -> Any:
    return step_name_format or standard_name_format(step_prefix=step_prefix,
                                                    step_format_fixed_length=step_format_fixed_length)


def get_snapshot_dir_from_step_dir(step_dir: Any, snapshot_dir: Any = None) -> Any:
    """Where the snapshot of the step directory ``step_dir`` goes: ``<root>/_SNAPSHOTS/<step
    name>`` (or ``<snapshot_dir>/<step name>``)."""
    step = _path(step_dir)
    name = step.name if isinstance(step, pathlib.Path) else step.rstrip("/").rsplit("/", 1)[-1]
    if snapshot_dir is None:
        parent = step.parent if isinstance(step, pathlib.Path) else step.rstrip("/").rsplit("/", 1)[0]
        return _join(_join(parent, _SNAPSHOTS), name)
    return _join(snapshot_dir, name)


def _copy_tree(source: Any, dest: Any) -> None:
    """Copy the directory ``source`` to ``dest`` (hard links on local disks where possible;
    object stores: each object read and written)."""
    if isinstance(source, pathlib.Path) and isinstance(dest, pathlib.Path):
        def link_or_copy(src: str, dst: str) -> None:
            try:
                os.link(src, dst)  # the snapshot shares the step's files: cheap, and immune to their deletion
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(source, dest, copy_function=link_or_copy, symlinks=True)
        return
    src_kv = open_kvstore(os.fspath(source), read_only=True)
    dst_kv = open_kvstore(os.fspath(dest))
    for key in src_kv.list(""):
        value = src_kv.get(key)
        if value is not None:
            dst_kv.set(key, value)


def _remove_tree(path: Any) -> None:
    if isinstance(path, pathlib.Path):
        shutil.rmtree(path)
    else:
        kv = open_kvstore(os.fspath(path))
        if not any(True for _ in kv.list("")):
            raise FileNotFoundError(f"Snapshot does not exist: {path}")
        kv.delete_prefix("")


def _snapshot_dir(checkpoint_dir: Any, snapshot_dir: Any) -> Any:
    return _path(snapshot_dir) if snapshot_dir is not None else _join(checkpoint_dir, _SNAPSHOTS)


def _snapshot_checkpoint(checkpoint_dir: Any, step: int, step_name_format: Any, snapshot_dir: Any = None, *,
                         set_immutable: bool | None = None, ignore_file_not_found_error: bool | None = None) -> bool:
    """Copy step ``step`` to the snapshot directory (once; the primary process only), so that
    a reader keeps it while the manager's retention deletes the step itself."""
    if not is_primary_host(0):
        return False
    step_dir = step_name_format.find_step(checkpoint_dir, step).path
    dest = get_snapshot_dir_from_step_dir(step_dir, _snapshot_dir(checkpoint_dir, snapshot_dir))
    if isinstance(dest, pathlib.Path):
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            return True
    try:
        _copy_tree(_path(step_dir), dest)
    except FileNotFoundError:  # the step was deleted while being copied
        if not ignore_file_not_found_error:
            raise
        _log.warning("Ignoring error when snapshotting checkpoint for step: %d", step, exc_info=True)
    return True


def _release_snapshot(checkpoint_dir: Any, step: int, step_name_format: Any, snapshot_dir: Any = None, *,
                      ignore_file_not_found_error: bool | None = None) -> None:
    """Delete the snapshot of step ``step`` (the primary process only)."""
    if not is_primary_host(0):
        return
    path = _join(_snapshot_dir(checkpoint_dir, snapshot_dir), step_name_format.build_name(step))
    try:
        _remove_tree(path)
    except FileNotFoundError:
        if not ignore_file_not_found_error:
            raise
        _log.warning("Ignoring error when releasing snapshot for step: %d", step, exc_info=True)


def _broadcast(value: int) -> int:
    """The primary process's ``value`` on every process of a multi-process JAX job."""
    jax = sys.modules.get("jax")
    if jax is None or jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils  # JAX is loaded (checked above)

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _exists(path: Any) -> bool:
    if isinstance(path, pathlib.Path):
        return path.is_dir()
    try:
        return any(True for _ in open_kvstore(os.fspath(path), read_only=True).list(""))
    except NotFoundError:
        return False


def _wait_for_new_checkpoint(checkpoint_dir: Any, fmt: Any, until_step: int | None, seconds_to_sleep: float,
                             timeout: float | None, timeout_fn: Callable[[], bool] | None, snapshot_dir: Any,
                             ignore_snapshot_errors: bool | None) -> int:
    """The newest finalized step (``>= until_step`` when given), snapshotted; ``-1`` once
    ``timeout`` passed and ``timeout_fn`` (if given) says to stop.  The primary process
    looks, every process gets its answer."""
    stop = time.time() + timeout if timeout is not None else None

    def sleep_or_stop() -> bool:
        if stop is not None and time.time() + seconds_to_sleep > stop and (timeout_fn is None or timeout_fn()):
            return True
        time.sleep(seconds_to_sleep)
        return False

    root = _path(checkpoint_dir)
    result = -1
    if is_primary_host(0):
        while True:
            if not _exists(root):
                if sleep_or_stop():
                    break
                continue
            steps = _steps(root)
            latest = max(steps) if steps else None
            if latest is not None and (until_step is None or latest >= until_step):
                if not _snapshot_checkpoint(root, latest, fmt, snapshot_dir,
                                            ignore_file_not_found_error=ignore_snapshot_errors):
                    continue
                result = latest
                break
            if sleep_or_stop():
                break
    return _broadcast(result)


@contextlib.contextmanager
def wait_for_new_checkpoint(checkpoint_dir: Any, *, until_step: int | None = None, seconds_to_sleep: int = 1,
                            timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                            step_prefix: str | None = None, step_format_fixed_length: int | None = None,
                            step_name_format: Any = None, snapshot_dir: Any = None, set_immutable: bool | None = None,
                            ignore_snapshot_errors: bool | None = True) -> Iterator[int]:
    """Wait for a finalized step (``>= until_step`` when given) and yield it, ``-1`` after
    ``timeout`` seconds (and ``timeout_fn()``, if given, returning true).  As Orbax, the step
    is snapshotted (copied to ``<root>/_SNAPSHOTS/<step>``, hard links on local disks) while
    the caller holds it, and the snapshot released afterwards.  A missing directory is
    waited for."""
    fmt = _name_format(step_prefix, step_format_fixed_length, step_name_format)
    step = _wait_for_new_checkpoint(checkpoint_dir, fmt, until_step, seconds_to_sleep, timeout, timeout_fn,
                                    snapshot_dir, ignore_snapshot_errors)
    try:
        yield step
    finally:
        if step != -1:
            _release_snapshot(_path(checkpoint_dir), step, fmt, snapshot_dir,
                              ignore_file_not_found_error=ignore_snapshot_errors)


def checkpoints_iterator(checkpoint_dir: Any, *, min_interval_secs: int = 0, seconds_to_sleep: int = 1,
                         timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                         step_prefix: str | None = None, step_format_fixed_length: int | None = None,
                         step_name_format: Any = None, snapshot_dir: Any = None, set_immutable: bool | None = None,
                         ignore_snapshot_errors: bool | None = True) -> Iterator[int]:
    """Yield each new finalized step as it appears (the newest one when several arrived),
    snapshotted while the caller holds it; stop after ``timeout`` seconds without one once
    ``timeout_fn()`` (if given) returns true.  Snapshots left by an earlier run are
    released first."""
    root = _path(checkpoint_dir)
    fmt = _name_format(step_prefix, step_format_fixed_length, step_name_format)
    snaps = _snapshot_dir(root, snapshot_dir)
    if isinstance(snaps, pathlib.Path) and snaps.is_dir() and is_primary_host(0):
        for leftover in snaps.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
    last: int | None = None
    while True:
        with wait_for_new_checkpoint(root, until_step=last + 1 if last is not None else None,
                                     seconds_to_sleep=seconds_to_sleep, timeout=timeout, timeout_fn=timeout_fn,
                                     step_name_format=fmt, snapshot_dir=snapshot_dir,
                                     ignore_snapshot_errors=ignore_snapshot_errors) as step:
            if step == -1:
                if timeout_fn is None or timeout_fn():
                    return
                continue
            started = time.time()
            last = step
            yield step
        pause = started + min_interval_secs - time.time()
        if pause > 0:
            time.sleep(pause)
