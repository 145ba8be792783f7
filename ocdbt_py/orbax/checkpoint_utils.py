"""``ocp.checkpoint_utils``: ``construct_restore_args`` (restore arguments from a target tree)
and the evaluation-loop helpers ``checkpoints_iterator`` / ``wait_for_new_checkpoint``."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ocdbt_py.checkpoint.meta import list_steps
from ocdbt_py.checkpoint.pytree import flatten_with_names
from ocdbt_py.errors import NotFoundError
from ocdbt_py.orbax.metadata_tree import TreeMetadata
from ocdbt_py.orbax.metadata_value import ArrayMetadata, Metadata, ScalarMetadata, StringMetadata
from ocdbt_py.orbax.type_handlers import PLACEHOLDER, ArrayRestoreArgs, RestoreArgs

__all__ = ["construct_restore_args", "wait_for_new_checkpoint", "checkpoints_iterator"]


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


def _wait(checkpoint_dir: Any, until_step: int | None, after: int | None, seconds_to_sleep: float,
          timeout: float | None) -> int:
    """The newest step (``>= until_step``, ``> after``), or -1 once ``timeout`` passed."""
    start = time.monotonic()
    while True:
        steps = [s for s in _steps(checkpoint_dir) if after is None or s > after]
        if steps and (until_step is None or max(steps) >= until_step):
            return max(steps)
        if timeout is not None and time.monotonic() - start + seconds_to_sleep > timeout:
            return -1
        time.sleep(seconds_to_sleep)


@contextlib.contextmanager
def wait_for_new_checkpoint(checkpoint_dir: Any, *, until_step: int | None = None, seconds_to_sleep: int = 1,
                            timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                            **ignored: Any) -> Iterator[int]:
    """Wait for a finalized step (``>= until_step`` when given) and yield it (``-1`` after
    ``timeout``).  Orbax snapshots the step while the caller holds it; ocdbt_py does not
    (keep ``max_to_keep`` large enough for readers)."""
    yield _wait(checkpoint_dir, until_step, None, seconds_to_sleep, timeout)


def checkpoints_iterator(checkpoint_dir: Any, *, min_interval_secs: int = 0, seconds_to_sleep: int = 1,
                         timeout: int | None = None, timeout_fn: Callable[[], bool] | None = None,
                         **ignored: Any) -> Iterator[int]:
    """Yield each new finalized step as it appears (the newest one when several arrived);
    stop after ``timeout`` seconds without one unless ``timeout_fn()`` returns ``False``."""
    last: int | None = None
    while True:
        started = time.monotonic()
        step = _wait(checkpoint_dir, None, last, seconds_to_sleep, timeout)
        if step == -1:
            if timeout_fn is None or timeout_fn():
                return
            continue
        last = step
        yield step
        pause = min_interval_secs - (time.monotonic() - started)
        if pause > 0:
            time.sleep(pause)
